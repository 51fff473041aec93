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
              {"a sticky CUDA error restarts the worker", {timeout, 120, fun sticky_error/0}}]};
        _ ->
            []
    end.

setup() ->
    application:load(erlcuda),
    ok = application:set_env(erlcuda, backend, cuda),
    ok = application:set_env(erlcuda, test_hooks, true),
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
    ?assertEqual({ok, [".lock"]}, file:list_dir(Dir)).

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
