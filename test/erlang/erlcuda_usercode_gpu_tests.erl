%% User kernels and buffers from Erlang on a GPU (backend = cuda): the cases of
%% erlcuda_usercode_cases (which erlcuda_usercode_tests runs on the cpu backend, with the
%% same expected results), and typed buffers with f64 kernels. Runs only with
%% ERLCUDA_TEST_GPU=1 (`make test-gpu'); elsewhere it is one skipped placeholder.
-module(erlcuda_usercode_gpu_tests).

-include_lib("eunit/include/eunit.hrl").

gpu_test_() ->
    case os:getenv("ERLCUDA_TEST_GPU") of
        "1" ->
            erlcuda_test_util:with_app(
              [{backend, cpu}], [{backend, cuda}],
              [{"raw kernels", {timeout, 300, fun erlcuda_usercode_cases:raw/0}},
               {"launch shapes", {timeout, 120, fun erlcuda_usercode_cases:shapes/0}},
               {"elementwise kernels",
                {timeout, 300, fun erlcuda_usercode_cases:elementwise/0}},
               {"a compile error", {timeout, 120, fun erlcuda_usercode_cases:compile_error/0}},
               {"typed buffers and f64 kernels", {timeout, 120, fun typed/0}},
               {"modules survive a worker restart",
                {timeout, 300, fun erlcuda_usercode_cases:replay/0}}]);
        _ ->
            [{"GPU user kernels (ERLCUDA_TEST_GPU=1 runs them)", fun() -> ok end}]
    end.

typed() ->
    [begin
         {ok, B} = erlcuda:upload(L, [{type, T}]),
         ?assertEqual({ok, L}, erlcuda:download(B)),
         ok = erlcuda:free(B)
     end || {T, L} <- [{f64, [1.0e300, -2.5]}, {i32, [-5, 7]}, {u32, [4294967295, 0]},
                       {i64, [-9223372036854775808, 1]}, {u8, [0, 255]}]],
    {ok, A} = erlcuda:upload([1.0e200, 2.0, 3.0, 4.0], [{type, f64}]),
    {ok, C} = erlcuda:launch_sync(vector_add, [A, A], [{keep, true}]),
    ?assertEqual({ok, [2.0e200, 4.0, 6.0, 8.0]}, erlcuda:download(C)),
    ?assertEqual({ok, [2.0e200, 4.0, 6.0, 8.0]},
                 erlcuda:launch_sync(matmul, [C, [1, 0, 0, 1], 2, 2, 2])),
    {ok, Sum} = erlcuda:launch_sync(reduce, [C]),
    ?assert(abs(Sum - 2.0e200) < 1.0e188),
    [ok = erlcuda:free(B) || B <- [A, C]].
