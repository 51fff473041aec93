%% User kernels from Erlang, the same cases on each backend: erlcuda_usercode_tests runs
%% them on the cpu backend (the source built for the host), erlcuda_usercode_gpu_tests on a
%% GPU (backend = cuda), with the same expected results. Raw kernels with data, counts and
%% buffers, launch shapes, kept results, elementwise kernels with one and two outputs, a
%% compile error, and loaded modules surviving a worker restart. Run in this order, in one
%% application: `replay' launches what the others loaded.
-module(erlcuda_usercode_cases).

-include_lib("eunit/include/eunit.hrl").

-export([raw/0, shapes/0, elementwise/0, compile_error/0, replay/0]).

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
    ?assertNotEqual(nomatch, binary:match(Log, <<"error">>)),
    {error, {compile, Log2}} = erlcuda:elementwise(bad_op, [{x, f32}], [{y, f32}],
                                                   <<"y = x +* ;">>, [{timeout, 240000}]),
    ?assertNotEqual(nomatch, binary:match(Log2, <<"operation">>)),
    ?assertNot(lists:member(broken, erlcuda_catalogue:modules())),
    ?assertNot(lists:member(bad_op, erlcuda_catalogue:modules())).

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
