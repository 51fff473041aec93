%% User kernels and buffers from Erlang on a GPU (backend = cuda): raw kernels with data,
%% counts and buffers, launch shapes, kept results, elementwise kernels with one and two
%% outputs, and loaded modules surviving a worker restart. Runs only with ERLCUDA_TEST_GPU=1
%% (`make test-gpu'); elsewhere it is one skipped placeholder.
-module(erlcuda_usercode_gpu_tests).

-include_lib("eunit/include/eunit.hrl").

-define(SCALE, <<"extern \"C\" __global__ void scale(float *x, float a, long long n) {\n"
                 "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                 "  if (i < n) x[i] *= a;\n"
                 "}\n"
                 "extern \"C\" __global__ void iota(int *out, long long n) {\n"
                 "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
                 "  if (i < n) out[i] = (int)i;\n"
                 "}\n"
                 "extern \"C\" __global__ void grid_ids(unsigned int *out) {\n"
                 "  unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);\n"
                 "  if (threadIdx.x == 0 && threadIdx.y == 0) out[b] = blockDim.x * blockDim.y;\n"
                 "}\n">>).

gpu_test_() ->
    case os:getenv("ERLCUDA_TEST_GPU") of
        "1" ->
            erlcuda_test_util:with_app(
              [{backend, cpu}], [{backend, cuda}],
              [{"raw kernels", {timeout, 300, fun raw/0}},
               {"launch shapes", {timeout, 120, fun shapes/0}},
               {"elementwise kernels", {timeout, 300, fun elementwise/0}},
               {"a compile error", {timeout, 120, fun compile_error/0}},
               {"typed buffers and f64 kernels", {timeout, 120, fun typed/0}},
               {"modules survive a worker restart", {timeout, 300, fun replay/0}}]);
        _ ->
            [{"GPU user kernels (ERLCUDA_TEST_GPU=1 runs them)", fun() -> ok end}]
    end.

load_scale() ->
    ok = erlcuda:load(gpu_mod, ?SCALE,
                      [{scale, [{inout, f32}, {scalar, f32}, {scalar, i64}]},
                       {iota, [{out, i32}, {scalar, i64}]},
                       {grid_ids, [{out, u32}]}],
                      [{timeout, 240000}]).

raw() ->
    ok = load_scale(),
    ?assertEqual([gpu_mod], erlcuda_catalogue:modules()),
    %% data in, the written pointer back, in a list
    ?assertEqual({ok, [[2.0, 4.0, 6.0]]}, erlcuda:launch_sync(scale, [[1.0, 2.0, 3.0], 2.0, 3])),
    %% a count: N zeroed elements, written by the kernel
    ?assertEqual({ok, [[0, 1, 2, 3, 4]]}, erlcuda:launch_sync(iota, [5, 5])),
    %% a buffer is used in place and is not in the reply
    {ok, X} = erlcuda:upload([1.0, 2.0, 3.0, 4.0], []),
    ?assertEqual({ok, []}, erlcuda:launch_sync(scale, [X, 10.0, 4])),
    ?assertEqual({ok, [10.0, 20.0, 30.0, 40.0]}, erlcuda:download(X)),
    %% kept: the written pointers stay on the device
    {ok, [K]} = erlcuda:launch_sync(iota, [1000, 1000], [{keep, true}]),
    ?assertMatch(#{type := i32, elements := 1000}, erlcuda:buffer_info(K)),
    ?assertEqual({ok, lists:seq(0, 999)}, erlcuda:download(K)),
    %% a user kernel's buffer feeds a built-in one
    {ok, S} = erlcuda:upload([float(I) || I <- lists:seq(0, 999)], []),
    ?assertEqual({ok, 499500.0}, erlcuda:launch_sync(reduce, [S])),
    %% a scalar out of its type's range is refused here
    ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(scale, [X, 1.0, 1 bsl 63])),
    [ok = erlcuda:free(B) || B <- [X, K, S]].

shapes() ->
    %% 4 x 3 x 2 blocks of 8 x 4 threads: every block writes its thread count
    ?assertEqual({ok, [lists:duplicate(24, 32)]},
                 erlcuda:launch_sync(grid_ids, [24], [{grid, {4, 3, 2}}, {block, {8, 4}}])),
    %% {elements, N}: blocks of 256 covering N
    {ok, [Ids]} = erlcuda:launch_sync(grid_ids, [10], [{elements, 1000}]),
    ?assertEqual([256, 256, 256, 256, 0, 0, 0, 0, 0, 0], Ids),
    %% the default covers the longest vector
    {ok, [Long]} = erlcuda:launch_sync(iota, [3000, 3000]),
    ?assertEqual(lists:seq(0, 2999), Long).

elementwise() ->
    ok = erlcuda:elementwise(saxpy, [{a, {scalar, f32}}, {x, f32}, {y, f32}], [{z, f32}],
                             <<"z = a * x + y">>, [{timeout, 240000}]),
    {ok, X} = erlcuda:upload([1.0, 2.0], []),
    ?assertEqual({ok, [3.0, 5.0]}, erlcuda:launch_sync(saxpy, [2.0, X, [1.0, 1.0]])),
    {ok, Z} = erlcuda:launch_sync(saxpy, [2.0, X, X], [{keep, true}]),
    ?assertMatch(#{type := f32, elements := 2}, erlcuda:buffer_info(Z)),
    ?assertEqual({ok, [3.0, 6.0]}, erlcuda:download(Z)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(saxpy, [2.0, X, [1.0]])),
    ok = erlcuda:elementwise(split, [{v, f64}], [{lo, i64}, {twice, f64}],
                             <<"lo = (long long)v; twice = 2 * v">>, [{timeout, 240000}]),
    ?assertEqual({ok, [[1, -2], [3.0, -5.0]]},
                 erlcuda:launch_sync(split, [[1.5, -2.5]])),
    {ok, [Lo, Tw]} = erlcuda:launch_sync(split, [[1.5, -2.5]], [{keep, true}]),
    ?assertEqual({ok, [1, -2]}, erlcuda:download(Lo)),
    ?assertEqual({ok, [3.0, -5.0]}, erlcuda:download(Tw)),
    %% reloading replaces: the same name, another operation
    ok = erlcuda:elementwise(saxpy, [{a, {scalar, f32}}, {x, f32}, {y, f32}], [{z, f32}],
                             <<"z = a * x - y">>, [{timeout, 240000}]),
    ?assertEqual({ok, [1.0, 3.0]}, erlcuda:launch_sync(saxpy, [2.0, X, [1.0, 1.0]])),
    [ok = erlcuda:free(B) || B <- [X, Z, Lo, Tw]],
    ok = erlcuda:unload(split),
    ?assertEqual({error, {unknown_kernel, split}}, erlcuda:launch_sync(split, [[1.0]])).

compile_error() ->
    {error, {compile, Log}} = erlcuda:load(broken, <<"extern \"C\" __global__ void b() { x }">>,
                                           [{b, []}], [{timeout, 240000}]),
    ?assert(is_binary(Log)),
    ?assertNot(lists:member(broken, erlcuda_catalogue:modules())).

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

%% A new worker gets every loaded module before it takes jobs: the kernels launch at once.
replay() ->
    ok = load_scale(),
    {ok, X} = erlcuda:upload([1.0, 2.0], []),
    #{worker_os_pid := Os, modules := Before} = erlcuda:info(),
    ?assert(lists:member(<<"gpu_mod">>, Before)),
    os:cmd("kill -9 " ++ integer_to_list(Os)),
    erlcuda_test_util:wait_restarted(Os, 600),
    ?assertEqual({ok, [[3.0, 6.0]]}, erlcuda:launch_sync(scale, [[1.0, 2.0], 3.0, 2])),
    ?assertEqual({ok, [1.0, 3.0]}, erlcuda:launch_sync(saxpy, [2.0, [1.0, 2.0], [1.0, 1.0]])),
    #{modules := After} = erlcuda:info(),
    ?assertEqual(lists:sort(Before), lists:sort(After)),
    ?assertEqual({error, {buffer_lost, X}}, erlcuda:download(X)).
