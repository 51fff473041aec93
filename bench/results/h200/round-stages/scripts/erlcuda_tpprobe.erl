-module(erlcuda_tpprobe).
-export([main/0]).

%% 1000 callers looping reduce 1e3 for a few seconds; meanwhile, the port owner's and the
%% writer's share of the time running (trace of running) and mailbox, and each worker
%% thread's CPU share (/proc).
main() ->
    application:load(erlcuda),
    application:set_env(erlcuda, python, os:getenv("ERLCUDA_PYTHON", "python3")),
    application:set_env(erlcuda, backend, list_to_atom(os:getenv("BACKEND", "cuda"))),
    application:set_env(erlcuda, max_queue, 100000),
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(500),
    OsPid = erlcuda_status:worker_os_pid(),
    Owner = whereis(erlcuda_worker),
    Callers = list_to_integer(os:getenv("CALLERS", "1000")),
    Kernel = list_to_atom(os:getenv("KERNEL", "reduce")),
    case os:getenv("TIMELINE") of
        false -> [probe(Kernel, Callers, OsPid, Owner) || _ <- [1, 2, 3]];
        _ -> [timeline(Kernel, Callers) || _ <- [1, 2, 3]]
    end,
    ok.

bin(N) -> << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(1, N) >>.

probe(Kernel, Callers, OsPid, Owner) ->
    A = bin(1000),
    Args = case Kernel of reduce -> [A]; vector_add -> [A, A] end,
    Stop = erlang:monotonic_time(millisecond) + 3000,
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {done, loop(Kernel, Args, Stop, 0)} end)
            || _ <- lists:seq(1, Callers)],
    timer:sleep(1000),
    Writer = writer(Owner),
    T0 = threads(OsPid),
    W0 = erlang:monotonic_time(nanosecond),
    Tracer = spawn(fun() -> tracer(#{}) end),
    [erlang:trace(P, true, [running, monotonic_timestamp, {tracer, Tracer}]) || P <- [Owner | Writer]],
    Q = sample(Owner, Writer, 50, []),
    [erlang:trace(P, false, [running]) || P <- [Owner | Writer]],
    W1 = erlang:monotonic_time(nanosecond),
    T1 = threads(OsPid),
    Tracer ! {report, self()},
    Busy = receive {busy, B} -> B end,
    Jobs = lists:sum([receive {done, J} -> J end || _ <- Pids]),
    Wall = (W1 - W0) / 1.0e9,
    io:format("~p ~b callers: ~b jobs/s over 3 s~n", [Kernel, Callers, round(Jobs / 3)]),
    [io:format("  ~p busy ~.1f %~n", [P, 100 * maps:get(P, Busy, 0) / (W1 - W0)]) || P <- [Owner | Writer]],
    io:format("  owner mailbox samples ~w~n  writer mailbox samples ~w~n", [[X || {X, _} <- Q], [Y || {_, Y} <- Q]]),
    io:format("  worker threads CPU % (over ~.2f s): ~w~n",
              [Wall, lists:reverse(lists:sort([round(100 * (maps:get(T, T1) - V) / 100 / Wall) || {T, V} <- maps:to_list(T0), maps:is_key(T, T1)]))]),
    ok.

writer(Owner) ->
    {links, L} = process_info(Owner, links),
    [P || P <- L, is_pid(P), proc_lib:translate_initial_call(P) =:= {erlcuda_writer, init, 1}].

loop(Kernel, Args, Stop, N) ->
    case erlang:monotonic_time(millisecond) >= Stop of
        true -> N;
        false ->
            {ok, _} = erlcuda:launch_sync(Kernel, Args, [{format, binary}, {timeout, 60000}]),
            loop(Kernel, Args, Stop, N + 1)
    end.

sample(_, _, 0, Acc) -> lists:reverse(Acc);
sample(Owner, Writer, K, Acc) ->
    {message_queue_len, O} = process_info(Owner, message_queue_len),
    W = case Writer of [P] -> element(2, process_info(P, message_queue_len)); _ -> -1 end,
    timer:sleep(20),
    sample(Owner, Writer, K - 1, [{O, W} | Acc]).

tracer(Acc) ->
    receive
        {trace_ts, P, in, _, T} -> tracer(Acc#{{in, P} => T});
        {trace_ts, P, out, _, T} ->
            case maps:take({in, P}, Acc) of
                {T0, A1} -> tracer(maps:update_with(P, fun(V) -> V + T - T0 end, T - T0, A1));
                error -> tracer(Acc)
            end;
        {report, To} -> To ! {busy, maps:filter(fun(K, _) -> is_pid(K) end, Acc)}
    end.

threads(OsPid) ->
    Dir = "/proc/" ++ integer_to_list(OsPid) ++ "/task",
    {ok, Tids} = file:list_dir(Dir),
    maps:from_list([{T, ticks(Dir ++ "/" ++ T ++ "/stat")} || T <- Tids]).

ticks(Path) ->
    {ok, B} = file:read_file(Path),
    [_, After] = binary:split(B, <<") ">>),
    F = binary:split(After, <<" ">>, [global]),
    binary_to_integer(lists:nth(12, F)) + binary_to_integer(lists:nth(13, F)).

%% Jobs answered in each 50 ms from the callers' start, over 2 s, and jobs/s as bench/run
%% counts them (1 s window) and over the steady part.
timeline(Kernel, Callers) ->
    A = bin(1000),
    Args = case Kernel of reduce -> [A]; vector_add -> [A, A] end,
    C = counters:new(1, [write_concurrency]),
    Self = self(),
    Pids = [spawn_link(fun() -> receive go -> ok end,
                                Self ! {done, cloop(Kernel, Args, C)} end)
            || _ <- lists:seq(1, Callers)],
    T0 = erlang:monotonic_time(millisecond),
    [P ! go || P <- Pids],
    Marks = tl_sample(C, T0, 40, []),
    [P ! stop || P <- Pids],
    _ = [receive {done, _} -> ok end || _ <- Pids],
    Rates = [D * 20 || D <- diffs([0 | Marks])],
    io:format("~p ~b callers: jobs/s in each 50 ms: ~w~n", [Kernel, Callers, Rates]),
    io:format("  first 1 s ~b jobs/s, 0.5-2 s ~b jobs/s~n",
              [lists:nth(20, Marks), round((lists:nth(40, Marks) - lists:nth(10, Marks)) / 1.5)]).

diffs([A, B | R]) -> [B - A | diffs([B | R])];
diffs(_) -> [].

tl_sample(_, _, 0, Acc) -> lists:reverse(Acc);
tl_sample(C, T0, K, Acc) ->
    I = 41 - K,
    Wait = T0 + 50 * I - erlang:monotonic_time(millisecond),
    timer:sleep(max(0, Wait)),
    tl_sample(C, T0, K - 1, [counters:get(C, 1) | Acc]).

cloop(Kernel, Args, C) ->
    receive stop -> ok
    after 0 ->
        {ok, _} = erlcuda:launch_sync(Kernel, Args, [{format, binary}, {timeout, 60000}]),
        counters:add(C, 1, 1),
        cloop(Kernel, Args, C)
    end.
