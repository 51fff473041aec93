%% The Erlang API with backend = cuda, on a real GPU. Runs only with ERLCUDA_TEST_GPU=1
%% (`make test-gpu'); elsewhere it holds no tests at all rather than passing empty ones.
-module(erlcuda_gpu_tests).

-include_lib("eunit/include/eunit.hrl").

gpu_test_() ->
    case os:getenv("ERLCUDA_TEST_GPU") of
        "1" ->
            {setup, fun setup/0, fun cleanup/1,
             [{"info reports the GPU", fun info/0},
              {"the four kernels at several sizes", {timeout, 120, fun kernels/0}},
              {"every device routes", fun routing/0},
              {"batches form under load, results match", {timeout, 120, fun batching/0}},
              {"1000 callers x 100 mixed jobs, all right", {timeout, 300, fun load/0}},
              {"SIGKILL under load: one reply each, then service", {timeout, 120, fun kill/0}},
              {"large operands and results through shared memory, nothing left behind",
               {timeout, 120, fun shared_memory/0}},
              {"a sticky CUDA error restarts the worker", {timeout, 120, fun sticky_error/0}},
              {"f64 kernels against f32 and exact sums", {timeout, 120, fun f64_kernels/0}},
              {"buffers of every element type round trip", {timeout, 120, fun buffer_types/0}},
              {"a chain of kernels on device buffers", {timeout, 120, fun buffer_chain/0}},
              {"a dead owner's buffers are freed", {timeout, 120, fun owner_death/0}},
              {"device out of memory: an error, then service", {timeout, 300, fun oom/0}},
              {"a raw user kernel and an elementwise one", {timeout, 300, fun user_kernels/0}},
              {"a compile error carries nvcc's log", {timeout, 300, fun compile_error/0}},
              {"programs: replayed as graphs, fused, and a faulting step",
               {timeout, 300, fun programs/0}},
              {"a faulting user kernel: cuda error, restart, modules loaded again",
               {timeout, 300, fun user_fault/0}}]};
        _ ->
            []
    end.

setup() ->
    application:load(erlcuda),
    ok = application:set_env(erlcuda, backend, cuda),
    ok = application:set_env(erlcuda, worker_module, "erlcuda_testworker"),
    ok = application:set_env(erlcuda, python_path, erlcuda_test_util:test_worker_path()),
    ok = application:set_env(erlcuda, max_queue, 100000),
    {ok, _} = application:ensure_all_started(erlcuda),
    ok.

cleanup(_) ->
    application:stop(erlcuda).

%% 1.6e7-element operands and result (64 MiB each, over the 1 MiB threshold) go through the
%% worker's /dev/shm folder; once answered, the folder is empty.
shared_memory() ->
    #{shm := #{dir := Dir}} = erlcuda_status:status(),
    N = 16000000,
    A = << <<(float(I rem 1000)):32/float-little>> || I <- lists:seq(1, N) >>,
    B = binary:copy(<<0.5:32/float-little>>, N),
    {ok, C} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}, {timeout, 60000}]),
    ?assertEqual(byte_size(A), byte_size(C)),
    ?assertEqual([0.5 + float(I rem 1000) || I <- lists:seq(1, 3000)],
                 floats(binary:part(C, 0, 12000))),
    ?assertEqual([0.5 + float(I rem 1000) || I <- lists:seq(N - 999, N)],
                 floats(binary:part(C, byte_size(C) - 4000, 4000))),
    {ok, S} = erlcuda:launch_sync(reduce, [B], [{timeout, 60000}]),
    ?assert(abs(S - 0.5 * N) =< 1.0e-5 * N),
    %% operand slots and result buffers stay while in use, then go once idle (shm_keep_ms)
    ok = erlcuda_test_util:wait_until(fun() -> file:list_dir(Dir) =:= {ok, [".lock"]} end, 600).

info() ->
    Info = erlcuda:info(),
    ?debugFmt("GPU info: ~p", [Info]),
    ?assertMatch(#{backend := cuda, status := ok}, Info),
    #{devices := N, device_info := Devices} = Info,
    ?assert(N >= 1),
    [?assertMatch(#{name := _, total_memory := T, free_memory := F,
                    compute_capability := [_, _]} when T > 0 andalso F > 0, D)
     || D <- Devices].

f32(List) -> << <<X:32/float-little>> || X <- List >>.
floats(Bin) -> [X || <<X:32/float-little>> <= Bin].
rand_vec(N) -> [rand:uniform() * 2 - 1 || _ <- lists:seq(1, N)].

close(A, B, Tol) ->
    lists:all(fun({X, Y}) -> abs(X - Y) =< Tol end, lists:zip(A, B)).

kernels() ->
    [begin
         A = rand_vec(N), B = rand_vec(N),
         %% references computed from the f32-rounded inputs
         FA = floats(f32(A)), FB = floats(f32(B)),
         {ok, C} = erlcuda:launch_sync(vector_add, [f32(A), f32(B)], [{format, binary}]),
         ?assert(close(floats(C), [X + Y || {X, Y} <- lists:zip(FA, FB)], 1.0e-6)),
         {ok, S} = erlcuda:launch_sync(reduce, [f32(A)]),
         ?assert(abs(S - lists:sum(FA)) =< 1.0e-5 * N + 1.0e-6),
         {ok, D} = erlcuda:launch_sync(dot_product, [A, B]),
         ?assert(abs(D - lists:sum([X * Y || {X, Y} <- lists:zip(FA, FB)])) =< 1.0e-5 * N + 1.0e-6)
     end || N <- [0, 1, 31, 1000, 1025, 100003]],
    [begin
         A = rand_vec(M * K), B = rand_vec(K * N),
         {ok, C} = erlcuda:launch_sync(matmul, [A, B, M, N, K]),
         FA = list_to_tuple(floats(f32(A))), FB = list_to_tuple(floats(f32(B))),
         Ref = [lists:sum([element(I * K + P + 1, FA) * element(P * N + J + 1, FB)
                           || P <- lists:seq(0, K - 1)])
                || I <- lists:seq(0, M - 1), J <- lists:seq(0, N - 1)],
         ?assertEqual(M * N, length(C)),
         ?assert(close(C, Ref, 1.0e-5 * max(K, 1)))
     end || {M, N, K} <- [{1, 1, 1}, {3, 5, 7}, {64, 64, 64}, {127, 129, 65}, {4, 3, 0}]].

routing() ->
    #{devices := N} = erlcuda:info(),
    [?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{device, D}]))
     || D <- lists:seq(0, N - 1)],
    ?assertEqual({error, {bad_device, N}}, erlcuda:launch_sync(reduce, [[1.0]], [{device, N}])).

batching() ->
    #{device_info := [Before | _]} = erlcuda:info(),
    Self = self(),
    Callers = 200, Jobs = 50,
    Pids = [spawn_link(fun() -> Self ! {done, self(), caller(C, Jobs)} end)
            || C <- lists:seq(1, Callers)],
    [receive {done, P, R} -> ?assertEqual(ok, R) after 60000 -> error(hung) end || P <- Pids],
    #{device_info := [After | _]} = erlcuda:info(),
    NJobs = maps:get(jobs, After) - maps:get(jobs, Before),
    NLaunches = maps:get(launches, After) - maps:get(launches, Before),
    ?debugFmt("~b jobs in ~b launches, largest batch ~b",
              [NJobs, NLaunches, maps:get(max_batch, After)]),
    ?assertEqual(Callers * Jobs, NJobs),
    ?assert(NLaunches < NJobs).

caller(C, Jobs) ->
    Kernels = [vector_add, reduce, dot_product, matmul],
    Launched = [begin
                    K = lists:nth(J rem 4 + 1, Kernels),
                    A = [float(C), float(J), 1.0, 2.0],
                    Args = case K of
                               reduce -> [A];
                               matmul -> [A, A, 2, 2, 2];
                               _ -> [A, A]
                           end,
                    {ok, Id} = erlcuda:launch(K, Args),
                    {Id, expected(K, A)}
                end || J <- lists:seq(1, Jobs)],
    Arrived = [receive {erlcuda, Id, {ok, V}} -> {Id, V} after 30000 -> error(no_reply) end
               || _ <- Launched],
    %% one caller, one device: replies arrive in the order launched, each its own
    Order = [Id || {Id, _} <- Launched],
    Order = [Id || {Id, _} <- Arrived],
    lists:foreach(fun({{_, Want}, {_, Got}}) -> true = close_any(Want, Got) end,
                  lists:zip(Launched, Arrived)),
    ok.

expected(vector_add, A) -> [2 * X || X <- A];
expected(reduce, A) -> lists:sum(A);
expected(dot_product, A) -> lists:sum([X * X || X <- A]);
expected(matmul, [A, B, C, D]) -> [A * A + B * C, A * B + B * D, C * A + D * C, C * B + D * D].

close_any(W, G) when is_list(W) -> close(W, G, 1.0e-3 * (1 + lists:max([abs(X) || X <- W])));
close_any(W, G) -> abs(W - G) =< 1.0e-3 * (1 + abs(W)).

load() ->
    R = erlcuda_load:run(#{processes => 1000, jobs => 100}),
    ?debugFmt("load on the GPU: ~p", [R]),
    ?assertMatch(#{jobs := 100000, replies := 100000, right := 100000, wrong := 0, lost := 0,
                   duplicated := 0}, R).

kill() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    R = erlcuda_load:run(#{processes => 300, jobs => 100, kill_after_ms => 150}),
    ?debugFmt("SIGKILL under load on the GPU: ~p", [R]),
    ?assertMatch(#{wrong := 0, lost := 0, duplicated := 0}, R),
    #{jobs := Jobs, replies := Replies} = R,
    ?assertEqual(Jobs, Replies),
    erlcuda_test_util:wait_restarted(Pid, 300),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{timeout, 30000}])).

sticky_error() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    Reply = erlcuda_worker:call(fault, [0], 30000),
    ?debugFmt("fault call answered: ~p", [Reply]),
    erlcuda_test_util:wait_restarted(Pid, 300),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], [{timeout, 30000}])),
    #{backend := cuda, status := ok} = erlcuda:info().

-define(T, [{timeout, 60000}]).

f64_kernels() ->
    N = 100000,
    A = [float(I rem 1000) / 7 || I <- lists:seq(1, N)],
    B = [float(I rem 333) / 3 || I <- lists:seq(1, N)],
    {ok, C} = erlcuda:launch_sync(vector_add, [A, B], [{type, f64} | ?T]),
    ?assertEqual([X + Y || {X, Y} <- lists:zip(A, B)], C),
    {ok, S} = erlcuda:launch_sync(reduce, [A], [{type, f64} | ?T]),
    ?assert(abs(S - lists:sum(A)) =< 1.0e-9 * abs(lists:sum(A))),
    {ok, D} = erlcuda:launch_sync(dot_product, [A, B], [{type, f64} | ?T]),
    Dot = lists:sum([X * Y || {X, Y} <- lists:zip(A, B)]),
    ?assert(abs(D - Dot) =< 1.0e-9 * abs(Dot)),
    M = [float(I) / 3 || I <- lists:seq(1, 6)],
    {ok, P} = erlcuda:launch_sync(matmul, [M, M, 2, 2, 3], [{type, f64} | ?T]),
    Expected = [lists:sum([lists:nth(R * 3 + K + 1, M) * lists:nth(K * 2 + Col + 1, M)
                           || K <- [0, 1, 2]]) || R <- [0, 1], Col <- [0, 1]],
    [?assert(abs(X - Y) =< 1.0e-12 * abs(Y)) || {X, Y} <- lists:zip(P, Expected)],
    {ok, Bin} = erlcuda:launch_sync(vector_add, [<<1.5:64/float-little>>, <<2.25:64/float-little>>],
                                    [{type, f64}, {format, binary} | ?T]),
    ?assertEqual(<<3.75:64/float-little>>, Bin).

buffer_types() ->
    Cases = [{f32, [1.5, -2.0, 3.25]}, {f64, [1.0e300, -2.5, 0.0]},
             {i32, [-2147483648, 0, 2147483647]}, {u32, [0, 1, 4294967295]},
             {i64, [-9223372036854775808, 42, 9223372036854775807]}, {u8, [0, 7, 255]}],
    [begin
         {ok, H} = erlcuda:upload(L, [{type, T} | ?T]),
         ?assertEqual({ok, L}, erlcuda:download(H, ?T)),
         ok = erlcuda:free(H),
         {ok, E} = erlcuda:upload([], [{type, T} | ?T]),
         ?assertEqual({ok, []}, erlcuda:download(E, ?T)),
         ok = erlcuda:free(E),
         {ok, Z} = erlcuda:zeros(T, 1000, ?T),
         {ok, ZL} = erlcuda:download(Z, ?T),
         ?assertEqual(1000, length(ZL)),
         ?assert(lists:all(fun(X) -> X == 0 end, ZL)),
         ok = erlcuda:free(Z)
     end || {T, L} <- Cases],
    Big = binary:copy(<<7:32/little>>, 5000000),   % 20 MB: through shared memory
    {ok, HB} = erlcuda:upload(Big, [{type, i32} | ?T]),
    ?assertEqual({ok, Big}, erlcuda:download(HB, [{format, binary} | ?T])),
    ok = erlcuda:free(HB).

buffer_chain() ->
    Base = buffers(),
    N = 1000000,
    A = << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(0, N - 1) >>,
    {ok, HA} = erlcuda:upload(A, ?T),
    {ok, HB} = erlcuda:upload(A, ?T),
    Last = lists:foldl(fun(_, X) ->
                               {ok, Y} = erlcuda:launch_sync(vector_add, [X, HB],
                                                             [{keep, true} | ?T]),
                               X =/= HA andalso erlcuda:free(X),
                               Y
                       end, HA, lists:seq(1, 10)),
    {ok, Got} = erlcuda:download(Last, [{format, binary} | ?T]),
    ?assertEqual(<< <<(11 * float(I rem 97)):32/float-little>> || I <- lists:seq(0, N - 1) >>,
                 Got),
    {ok, S} = erlcuda:launch_sync(reduce, [Last], ?T),
    ?assert(abs(S - 11 * lists:sum([float(I rem 97) || I <- lists:seq(0, N - 1)])) < 1.0e3),
    [ok = erlcuda:free(H) || H <- [HA, HB, Last]],
    ?assertEqual(Base, buffers()).

owner_death() ->
    Base = buffers(),
    #{device_info := [#{free_memory := Free0} | _]} = erlcuda:info(),
    Self = self(),
    Pids = [spawn(fun() ->
                          {ok, H} = erlcuda:upload(lists:duplicate(1000, 1.0), ?T),
                          {ok, _} = erlcuda:launch_sync(vector_add, [H, H], [{keep, true} | ?T]),
                          Self ! {done, self()}
                  end) || _ <- lists:seq(1, 1000)],
    [receive {done, P} -> ok end || P <- Pids],
    ok = erlcuda_test_util:wait_until(fun() -> buffers() =:= Base end, 100),
    %% The device's own count agrees: what the 2000 buffers took is free again (the
    %% allocator may keep a little for itself).
    #{device_info := [#{free_memory := Free1} | _]} = erlcuda:info(),
    ?debugFmt("free device memory before ~b, after ~b", [Free0, Free1]),
    ?assert(Free1 >= Free0 - 64 * 1024 * 1024).

oom() ->
    Base = buffers(),
    Grab = fun Grab(Acc, 0) -> {Acc, none};
               Grab(Acc, K) ->
                   case erlcuda:empty(f64, 2147483647, ?T) of
                       {ok, H} -> Grab([H | Acc], K - 1);
                       {error, Why} -> {Acc, Why}
                   end
           end,
    {Held, Why} = Grab([], 40),
    ?debugFmt("out of memory after ~b buffers of 16 GiB: ~p", [length(Held), Why]),
    ?assertMatch({cuda, out_of_memory, _}, Why),
    [ok = erlcuda:free(H) || H <- Held],
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]], ?T)),
    ok = erlcuda_test_util:wait_until(fun() -> buffers() =:= Base end, 100).

scale_source() ->
    <<"extern \"C\" __global__ void gpu_scale(float *x, float a, long long n) {\n"
      "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n"
      "  if (i < n) x[i] *= a;\n"
      "}\n"
      "extern \"C\" __global__ void gpu_fault(int *x) { x[1LL << 40] = 1; }\n">>.

user_kernels() ->
    ok = erlcuda:load(gpu_test_module, scale_source(),
                      [{gpu_scale, [{inout, f32}, {scalar, f32}, {scalar, i64}]},
                       {gpu_fault, [{inout, i32}]}], ?T),
    ?assertEqual({ok, [[2.0, 4.0, 6.0]]},
                 erlcuda:launch_sync(gpu_scale, [[1.0, 2.0, 3.0], 2.0, 3], ?T)),
    {ok, H} = erlcuda:upload([1.0, 2.0, 3.0, 4.0], ?T),
    ?assertEqual({ok, []}, erlcuda:launch_sync(gpu_scale, [H, 10.0, 4], [{elements, 4} | ?T])),
    ?assertEqual({ok, [10.0, 20.0, 30.0, 40.0]}, erlcuda:download(H, ?T)),
    ok = erlcuda:elementwise(gpu_saxpy, [{a, {scalar, f64}}, {x, f64}, {y, f64}], [{z, f64}],
                             <<"z = a * x + y">>, ?T),
    ?assertEqual({ok, [3.0, 5.0]},
                 erlcuda:launch_sync(gpu_saxpy, [2.0, [1.0, 2.0], [1.0, 1.0]], [{type, f64} | ?T])),
    {ok, X} = erlcuda:upload(lists:seq(1, 100000), [{type, i64} | ?T]),
    ok = erlcuda:elementwise(gpu_sq, [{x, i64}], [{y, i64}, {z, f64}],
                             <<"y = x * x; z = (double)x / 2">>, ?T),
    {ok, [Y, Z]} = erlcuda:launch_sync(gpu_sq, [X], ?T),
    ?assertEqual([I * I || I <- lists:seq(1, 100000)], Y),
    ?assertEqual([I / 2 || I <- lists:seq(1, 100000)], Z),
    {ok, [HY, HZ]} = erlcuda:launch_sync(gpu_sq, [X], [{keep, true} | ?T]),
    ?assertEqual({ok, Y}, erlcuda:download(HY, ?T)),
    [ok = erlcuda:free(B) || B <- [H, X, HY, HZ]].

compile_error() ->
    {error, {compile, Log}} = erlcuda:load(gpu_broken, <<"extern \"C\" __global__ void broken() { nope; }">>,
                                           [{broken, []}], ?T),
    ?debugFmt("nvcc said: ~ts", [Log]),
    ?assertNotEqual(nomatch, binary:match(Log, <<"nope">>)).

%% A program on buffers run again and again: right every time; replayed as a CUDA graph
%% where the worker's Python has cuda-bindings; its elementwise steps fused once nvcc has
%% built their kernel. A step that faults answers as a faulting launch does: the worker
%% restarts, and the program runs again.
programs() ->
    ok = erlcuda:elementwise(gpu_axpy, [{a, {scalar, f32}}, {x, f32}, {y, f32}], [{z, f32}],
                             <<"z = a * x + y">>, ?T),
    N = 1000,
    Xs = [float(I rem 13) || I <- lists:seq(1, N)],
    Ys = [float(I rem 7) || I <- lists:seq(1, N)],
    {ok, X} = erlcuda:upload(Xs, ?T),
    {ok, Y} = erlcuda:upload(Ys, ?T),
    {ok, P} = erlcuda:program(#{inputs => [x, y],
                                steps => [{s1, vector_add, [x, y]}, {s2, gpu_axpy, [2.0, s1, y]},
                                          {s3, vector_add, [s2, x]}, {t, reduce, [s3]}],
                                outputs => [t, s3]}),
    S3 = [2 * (A + B) + B + A || {A, B} <- lists:zip(Xs, Ys)],
    Want = {ok, [lists:sum(S3), S3]},
    Run = fun() -> erlcuda:run_sync(P, [X, Y], ?T) end,
    [?assertEqual(Want, Run()) || _ <- lists:seq(1, 20)],
    ok = erlcuda_test_util:wait_until(fun() -> Run() =:= Want andalso
                                               program_counter(fused_runs) > 0 end, 1200),
    case os:cmd("python3 -c 'import cuda.bindings' 2>&1") of
        "" -> ?assert(program_counter(graph_runs) > 0 andalso program_counter(captures) > 0);
        Why -> ?debugFmt("no cuda-bindings, no graphs: ~ts", [Why])
    end,
    #{worker_os_pid := Pid} = erlcuda:info(),
    {ok, Fault} = erlcuda:program(#{inputs => [v], steps => [{f, gpu_fault, [v]}],
                                    outputs => f}),
    ?assertMatch({error, {cuda, _, _}}, erlcuda:run_sync(Fault, [[0, 0]], [{type, i32} | ?T])),
    erlcuda_test_util:wait_restarted(Pid, 300),
    {ok, X2} = erlcuda:upload(Xs, ?T),
    {ok, Y2} = erlcuda:upload(Ys, ?T),
    ?assertEqual(Want, erlcuda:run_sync(P, [X2, Y2], ?T)),
    ?assertEqual(Want, erlcuda:run_sync(P, [Xs, Ys], ?T)),
    [ok = erlcuda:free(B) || B <- [X2, Y2]].

program_counter(Key) ->
    #{device_info := [#{programs := Counters} | _]} = erlcuda:info(),
    maps:get(Key, Counters).

user_fault() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    {ok, Keep} = erlcuda:upload([1.0], ?T),
    Reply = erlcuda:launch_sync(gpu_fault, [[0, 0]], [{elements, 1} | ?T]),
    ?debugFmt("a faulting kernel answered: ~p", [Reply]),
    ?assertMatch({error, {cuda, _, _}}, Reply),
    erlcuda_test_util:wait_restarted(Pid, 300),
    ?assertMatch({error, {buffer_lost, _}}, erlcuda:download(Keep, ?T)),
    %% The modules loaded before the restart were loaded again before jobs were taken.
    ?assertEqual({ok, [[3.0]]}, erlcuda:launch_sync(gpu_scale, [[1.5], 2.0, 1], ?T)),
    ?assertEqual({ok, [3.0, 5.0]},
                 erlcuda:launch_sync(gpu_saxpy, [2.0, [1.0, 2.0], [1.0, 1.0]], [{type, f64} | ?T])).

buffers() ->
    #{device_info := Devices} = erlcuda:info(),
    [{maps:get(buffers, D), maps:get(buffer_bytes, D)} || D <- Devices].
