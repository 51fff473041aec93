%% Which of erlcuda's serial stages bounds the rate of many callers: callers looping
%% `launch_sync' of a 1000-element job (binaries), and meanwhile
%%
%% - `stages' (the default): for one second in the middle of a 3-second run, the share of
%%   the time that the port owner (erlcuda_worker) and the port's writer (erlcuda_writer)
%%   spent running (a trace of their scheduling in and out), their mailboxes sampled every
%%   20 ms, and each thread of the worker process's share of a core (from /proc). A stage
%%   near 100 % is a bound; a worker thread's share counts its spinning too.
%% - `timeline': the jobs answered in each 50 ms from the callers' start, over 2 s, and the
%%   rate over the first second (what `bench/run --quick' counts) and over 0.5 to 2 s.
%%
%%   erlc -o /tmp bench/erlcuda_saturation.erl
%%   ERLCUDA_PYTHON=python3 [BACKEND=cuda] [KERNEL=reduce|vector_add] [CALLERS=1000] \
%%   [MODE=stages|timeline] erl -noshell -pa _build/default/lib/erlcuda/ebin -pa /tmp \
%%       -eval 'erlcuda_saturation:main(), halt().'
%%
%% Three runs, one after another in one node. Tracing costs the traced processes some
%% time: `stages' rates are a little under the untraced ones. Not part of the application.
-module(erlcuda_saturation).
-export([main/0]).

-define(OPTS, [{format, binary}, {timeout, 60000}]).

main() ->
    ok = application:load(erlcuda),
    Env = [{python, os:getenv("ERLCUDA_PYTHON", "python3")},
           {backend, list_to_atom(os:getenv("BACKEND", "cuda"))}, {max_queue, 100000}],
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    {ok, _} = application:ensure_all_started(erlcuda),
    timer:sleep(500),
    Kernel = list_to_atom(os:getenv("KERNEL", "reduce")),
    Callers = list_to_integer(os:getenv("CALLERS", "1000")),
    X = << <<(float(I rem 97)):32/float-little>> || I <- lists:seq(1, 1000) >>,
    Args = case Kernel of reduce -> [X]; vector_add -> [X, X] end,
    Run = case os:getenv("MODE", "stages") of
              "stages" -> fun stages/3;
              "timeline" -> fun timeline/3
          end,
    [Run(Kernel, Args, Callers) || _ <- [1, 2, 3]],
    ok.

%% -- stages ---------------------------------------------------------------------------------

stages(Kernel, Args, Callers) ->
    Owner = whereis(erlcuda_worker),
    Traced = [Owner | writers(Owner)],
    OsPid = erlcuda_status:worker_os_pid(),
    Stop = erlang:monotonic_time(millisecond) + 3000,
    {Done, Pids} = callers(Kernel, Args, Callers),
    [P ! go || P <- Pids],
    timer:sleep(1000),
    Threads0 = thread_ticks(OsPid),
    T0 = erlang:monotonic_time(nanosecond),
    Tracer = spawn_link(fun() -> running(#{}) end),
    [erlang:trace(P, true, [running, monotonic_timestamp, {tracer, Tracer}]) || P <- Traced],
    Mailboxes = mailboxes(Traced, 50),
    [erlang:trace(P, false, [running]) || P <- Traced],
    T1 = erlang:monotonic_time(nanosecond),
    Threads1 = thread_ticks(OsPid),
    Tracer ! {report, self()},
    Busy = receive {busy, B} -> B end,
    timer:sleep(max(0, Stop - erlang:monotonic_time(millisecond))),
    Jobs = stopped(Done, Pids),
    Wall = (T1 - T0) / 1.0e9,
    io:format("~p, ~b callers: ~b jobs/s over 3 s~n", [Kernel, Callers, round(Jobs / 3)]),
    [io:format("  ~s ~p: running ~.1f % of ~.2f s; mailbox every 20 ms ~w~n",
               [Name, P, 100 * maps:get(P, Busy, 0) / (T1 - T0), Wall, Lens])
     || {Name, P, Lens} <- lists:zip3(lists:sublist(["port owner", "writer"], length(Traced)),
                                      Traced, Mailboxes)],
    Hz = ticks_per_s(),
    Shares = [round(100 * (Ticks - maps:get(Tid, Threads0)) / Hz / Wall)
              || {Tid, Ticks} <- maps:to_list(Threads1), maps:is_key(Tid, Threads0)],
    io:format("  worker threads, % of a core each (busiest first): ~w~n",
              [lists:reverse(lists:sort(Shares))]).

%% The port's writer: the process the port owner linked that runs erlcuda_writer.
writers(Owner) ->
    {links, Links} = process_info(Owner, links),
    [P || P <- Links, is_pid(P),
          proc_lib:translate_initial_call(P) =:= {erlcuda_writer, init, 1}].

%% Each traced process's mailbox length, every 20 ms, Count times: one list per process.
mailboxes(Traced, Count) ->
    Samples = [begin
                   Lens = [element(2, process_info(P, message_queue_len)) || P <- Traced],
                   timer:sleep(20),
                   Lens
               end || _ <- lists:seq(1, Count)],
    [[lists:nth(I, S) || S <- Samples] || I <- lists:seq(1, length(Traced))].

%% Sums each traced process's time between `in' and `out'.
running(Acc) ->
    receive
        {trace_ts, P, in, _, T} ->
            running(Acc#{{in, P} => T});
        {trace_ts, P, out, _, T} ->
            case maps:take({in, P}, Acc) of
                {In, Rest} -> running(maps:update_with(P, fun(V) -> V + T - In end, T - In,
                                                       Rest));
                error -> running(Acc)
            end;
        {report, To} ->
            To ! {busy, maps:filter(fun(K, _) -> is_pid(K) end, Acc)}
    end.

%% Each thread's user + system clock ticks so far.
thread_ticks(OsPid) ->
    Dir = filename:join(["/proc", integer_to_list(OsPid), "task"]),
    {ok, Tids} = file:list_dir(Dir),
    maps:from_list([{Tid, ticks(filename:join([Dir, Tid, "stat"]))} || Tid <- Tids]).

ticks(Stat) ->
    {ok, Line} = file:read_file(Stat),
    [_, AfterName] = binary:split(Line, <<") ">>),
    Fields = binary:split(AfterName, <<" ">>, [global]),
    %% utime and stime: fields 14 and 15 of the line, 12 and 13 after the name.
    binary_to_integer(lists:nth(12, Fields)) + binary_to_integer(lists:nth(13, Fields)).

ticks_per_s() ->
    case string:to_integer(os:cmd("getconf CLK_TCK")) of
        {Hz, _} when is_integer(Hz), Hz > 0 -> Hz;
        _ -> 100
    end.

%% -- timeline -------------------------------------------------------------------------------

timeline(Kernel, Args, Callers) ->
    {Done, Pids} = callers(Kernel, Args, Callers),
    T0 = erlang:monotonic_time(millisecond),
    [P ! go || P <- Pids],
    Marks = [begin
                 timer:sleep(max(0, T0 + 50 * I - erlang:monotonic_time(millisecond))),
                 counters:get(Done, 1)
             end || I <- lists:seq(1, 40)],
    _ = stopped(Done, Pids),
    Steps = lists:zipwith(fun(A, B) -> 20 * (B - A) end, [0 | lists:droplast(Marks)], Marks),
    io:format("~p, ~b callers: jobs/s in each 50 ms: ~w~n", [Kernel, Callers, Steps]),
    io:format("  first second ~b jobs/s; 0.5 to 2 s ~b jobs/s~n",
              [lists:nth(20, Marks),
               round((lists:nth(40, Marks) - lists:nth(10, Marks)) / 1.5)]).

%% -- the callers ---------------------------------------------------------------------------

%% `Callers' processes that each loop `launch_sync' from `go' until `stop', counting the jobs
%% answered in `Done'.
callers(Kernel, Args, Callers) ->
    Done = counters:new(1, [write_concurrency]),
    Self = self(),
    Pids = [spawn_link(fun() -> receive go -> ok end,
                                Self ! {done, counting(Kernel, Args, Done)} end)
            || _ <- lists:seq(1, Callers)],
    {Done, Pids}.

%% The callers stopped, each once its job in flight is answered: the jobs answered.
stopped(Done, Pids) ->
    [P ! stop || P <- Pids],
    _ = [receive {done, _} -> ok end || _ <- Pids],
    counters:get(Done, 1).

counting(Kernel, Args, Done) ->
    receive
        stop -> ok
    after 0 ->
        {ok, _} = erlcuda:launch_sync(Kernel, Args, ?OPTS),
        counters:add(Done, 1, 1),
        counting(Kernel, Args, Done)
    end.
