%% @private
%% The worker's status as callers see it, and the per-device queue counters: one public ETS
%% row read by every launch, written only by the port owner (`erlcuda_worker').
-module(erlcuda_status).

-export([create/0, set_up/6, set_down/1, set_unavailable/1, set_bad_python/1, status/0,
         enqueue/2, dequeue/2, in_flight/0, in_flight/2, pick/2, set_worker_os_pid/1,
         worker_os_pid/0, max_devices/0, next_epoch/0, epoch/0, take/3, waiting/2,
         add_waiting/3, clear_waiting/0, settle/2, drop_shm/1]).

-export_type([status/0, queues/0, seen/0]).

-define(TAB, erlcuda_status).
%% More devices than any host has: a bound on what a worker or the config may claim.
-define(EPOCHS, {?MODULE, epochs}).
%% Three counters a device in `queues': its jobs in flight, the launches waiting for room
%% on it (erlcuda_room), and the places ever taken on it (what settle/2 tells a count held
%% all along from one that came and went by).
-define(PER_DEVICE, 3).
-define(IN_FLIGHT(Device), (?PER_DEVICE * (Device) + 1)).
-define(WAITING(Device), (?PER_DEVICE * (Device) + 2)).
-define(TAKEN(Device), (?PER_DEVICE * (Device) + 3)).
%% A count held this long with no job registered and no place taken is owed to no job.
-define(SETTLE_MS, 1000).

-type queues() :: atomics:atomics_ref().
%% Per device, a count off zero as settle/2 last saw it (with its queues and the places
%% taken then) and since when.
-type seen() :: #{non_neg_integer() => {{queues(), integer(), integer()}, integer()}}.
%% epoch: the worker's generation, which its buffers carry (`next_epoch/0').
-type status() :: #{status := up, port := port(), devices := non_neg_integer(),
                    queues := queues(), max_queue := pos_integer(), writer := pid(),
                    writer_counters := erlcuda_writer:counters(),
                    shm := erlcuda_shm:folder() | none, epoch := non_neg_integer()}
                | #{status := {down, term()} | {unavailable, binary()}
                              | {bad_python, binary()},
                    queues := queues() | undefined}.

%% @doc The table; created by the application's process so that it outlives the owner.
-spec create() -> ok.
create() ->
    ?TAB = ets:new(?TAB, [set, public, named_table, {read_concurrency, true}]),
    %% The counter lives as long as the node: a handle of an earlier start of the
    %% application never names a worker of this one. It starts from the clock, in
    %% microseconds, so that a node started again under the same name (after a crash)
    %% never takes a handle of its earlier life for one of its own buffers, which would
    %% read and write another process's data (a life would have to start a worker every
    %% microsecond to catch up with the clock).
    case persistent_term:get(?EPOCHS, undefined) of
        undefined ->
            Epochs = atomics:new(1, [{signed, false}]),
            ok = atomics:put(Epochs, 1, erlang:system_time(microsecond)),
            persistent_term:put(?EPOCHS, Epochs);
        _ ->
            ok
    end,
    set_down(starting).

%% @doc A new worker generation: each start of a worker takes one.
-spec next_epoch() -> pos_integer().
next_epoch() ->
    atomics:add_get(persistent_term:get(?EPOCHS), 1, 1).

%% @doc The latest worker generation (before the first worker, where the counter starts).
-spec epoch() -> non_neg_integer().
epoch() ->
    case persistent_term:get(?EPOCHS, undefined) of
        undefined -> 0;
        Ref -> atomics:get(Ref, 1)
    end.

%% @doc Launches go to `Port' (or, while it is busy, to its `Writer'), spread over `Devices'.
%% The counters of jobs already in flight are kept when the device count is unchanged (a
%% hello confirming a restart).
-spec set_up(port(), {pid(), erlcuda_writer:counters()}, non_neg_integer(), pos_integer(),
             erlcuda_shm:folder() | none, non_neg_integer()) ->
    ok.
set_up(Port, {Writer, WriterCounters}, Devices, MaxQueue, Shm, Epoch) ->
    Queues = case status() of
                 #{devices := Devices, queues := Q} -> Q;
                 _ -> atomics:new(?PER_DEVICE * max(Devices, 1), [{signed, true}])
             end,
    store(#{status => up, port => Port, devices => Devices, queues => Queues,
          max_queue => MaxQueue, writer => Writer, writer_counters => WriterCounters,
          shm => Shm, epoch => Epoch}).

%% @doc The worker of `Port' has no shared memory after all: launches from now on take the
%% pipe.
-spec drop_shm(port()) -> ok.
drop_shm(Port) ->
    case status() of
        #{status := up, port := Port} = Status -> store(Status#{shm := none});
        _ -> ok
    end.

-spec set_down(term()) -> ok.
set_down(Why) ->
    store(#{status => {down, Why}, queues => queues()}).

-spec set_unavailable(binary()) -> ok.
set_unavailable(Why) ->
    store(#{status => {unavailable, Why}, queues => queues()}).

%% @doc No worker runs: the configured Python cannot run one (erlcuda_python).
-spec set_bad_python(binary()) -> ok.
set_bad_python(Detail) ->
    store(#{status => {bad_python, Detail}, queues => queues()}).

%% @doc The status; `{down, not_running}' when the application is not started.
-spec status() -> status().
status() ->
    try ets:lookup(?TAB, worker) of
        [{worker, Status}] -> Status;
        [] -> #{status => {down, starting}, queues => undefined}
    catch
        error:badarg -> #{status => {down, not_running}, queues => undefined}
    end.

%% @doc Count a job in on `Device', unless `max_queue' are already in flight there.
-spec enqueue(status(), non_neg_integer()) -> ok | overloaded.
enqueue(#{queues := Queues, max_queue := Max}, Device) ->
    case atomics:add_get(Queues, ?IN_FLIGHT(Device), 1) of
        Depth when Depth > Max -> dequeue(Queues, Device), overloaded;
        _ -> atomics:add(Queues, ?TAKEN(Device), 1)
    end.

%% @doc The jobs in flight on every device of the worker now running (0 when none runs).
-spec in_flight() -> non_neg_integer().
in_flight() ->
    case queues() of
        undefined ->
            0;
        Queues ->
            lists:sum([max(atomics:get(Queues, ?IN_FLIGHT(D)), 0)
                       || D <- lists:seq(0, devices(Queues) - 1)])
    end.

%% @doc A job leaves `Device''s queue. Where launches wait for room there, the waiting room
%% is told (a message, so that whoever calls this never waits): the one cost of waiting
%% that a queue without waiters pays is the read of their count.
-spec dequeue(queues(), non_neg_integer()) -> ok.
dequeue(Queues, Device) ->
    atomics:sub(Queues, ?IN_FLIGHT(Device), 1),
    room_made(Queues, Device).

room_made(Queues, Device) ->
    case atomics:get(Queues, ?WAITING(Device)) of
        0 ->
            ok;
        _ ->
            case whereis(erlcuda_room) of
                undefined -> ok;
                Room -> Room ! {erlcuda_room, room, Queues, Device}, ok
            end
    end.

%% @doc Put the in-flight counts right while no job is registered (the port owner calls
%% this on its tick, when erlcuda_jobs holds none; `Seen' is what the last call returned,
%% `#{}' after a tick with jobs; `Idle' says whether that is still so). A count off zero
%% then may belong to a caller killed between taking its place and registering its job,
%% a place nothing else would ever give back (with `max_queue' of them the device would
%% refuse every launch as `overloaded'); or to a caller about to register, or a waiter the
%% room just granted a place, whose count must stay. So a count is put to zero only once it
%% stayed the same, with no place taken on its device, for ?SETTLE_MS, and only if no job
%% is registered and it is still that count (compare-and-swap). A caller held up that long
%% between taking its place and registering loses its count (its job's end then takes the
%% count below zero, and that is put right the same way).
-spec settle(seen(), fun(() -> boolean())) -> seen().
settle(Seen, Idle) ->
    case queues() of
        undefined ->
            #{};
        Queues ->
            Now = erlang:monotonic_time(millisecond),
            maps:from_list([{D, S} || D <- lists:seq(0, devices(Queues) - 1),
                                      S <- [settle(Queues, D, maps:get(D, Seen, none), Now,
                                                   Idle)],
                                      S =/= none])
    end.

settle(Queues, Device, Seen, Now, Idle) ->
    Count = {Queues, atomics:get(Queues, ?IN_FLIGHT(Device)),
             atomics:get(Queues, ?TAKEN(Device))},
    case {Count, Seen} of
        {{_, 0, _}, _} ->
            none;
        {_, {Count, Since}} when Now - Since >= ?SETTLE_MS ->
            {_, InFlight, _} = Count,
            case Idle() andalso
                 atomics:compare_exchange(Queues, ?IN_FLIGHT(Device), InFlight, 0) =:= ok of
                true -> room_made(Queues, Device), none;
                false -> Seen
            end;
        {_, {Count, _}} ->
            Seen;
        _ ->
            {Count, Now}
    end.

devices(Queues) ->
    maps:get(size, atomics:info(Queues)) div ?PER_DEVICE.

%% @doc The waiting room takes a place on `Device' for its first waiter, if one is free.
-spec take(queues(), non_neg_integer(), pos_integer()) -> boolean().
take(Queues, Device, Max) ->
    case atomics:add_get(Queues, ?IN_FLIGHT(Device), 1) of
        Depth when Depth > Max -> atomics:sub(Queues, ?IN_FLIGHT(Device), 1), false;
        _ -> atomics:add(Queues, ?TAKEN(Device), 1), true
    end.

%% @doc The launches waiting for room on `Device'.
-spec waiting(queues() | undefined, non_neg_integer()) -> integer().
waiting(undefined, _) -> 0;
waiting(Queues, Device) ->
    case Device < devices(Queues) of
        true -> atomics:get(Queues, ?WAITING(Device));
        false -> 0
    end.

%% @doc Count waiters in (`Delta' 1) or out (-1); only the waiting room does.
-spec add_waiting(queues(), non_neg_integer(), integer()) -> ok.
add_waiting(Queues, Device, Delta) ->
    atomics:add(Queues, ?WAITING(Device), Delta).

%% @doc No launch waits any more (a waiting room that starts again).
-spec clear_waiting() -> ok.
clear_waiting() ->
    case queues() of
        undefined -> ok;
        Queues ->
            lists:foreach(fun(D) -> atomics:put(Queues, ?WAITING(D), 0) end,
                          lists:seq(0, devices(Queues) - 1))
    end.

-spec in_flight(queues() | undefined, non_neg_integer()) -> integer().
in_flight(undefined, _) -> 0;
in_flight(Queues, Device) ->
    case Device < devices(Queues) of
        true -> max(atomics:get(Queues, ?IN_FLIGHT(Device)), 0);
        false -> 0
    end.

%% @doc The device for a launch: the one asked for, or for `any' the shortest queue.
-spec pick(erlcuda:device(), status()) -> {ok, non_neg_integer()} | {error, {bad_device, term()}}.
pick(any, #{devices := Devices, queues := Queues}) when Devices > 0 ->
    {ok, shortest(Queues, Devices - 1, 0, atomics:get(Queues, ?IN_FLIGHT(0)))};
pick(N, #{devices := Devices}) when is_integer(N), N >= 0, N < Devices ->
    {ok, N};
pick(N, _) ->
    {error, {bad_device, N}}.

shortest(_, 0, Best, _) -> Best;
shortest(Queues, I, Best, BestDepth) ->
    case atomics:get(Queues, ?IN_FLIGHT(I)) of
        D when D < BestDepth -> shortest(Queues, I - 1, I, D);
        _ -> shortest(Queues, I - 1, Best, BestDepth)
    end.

%% @doc The most devices a worker may report (and the cpu backend may be given).
-spec max_devices() -> pos_integer().
max_devices() ->
    erlcuda_contract:max_devices().

%% @doc The worker's OS pid, kept here so that a port owner killed without running its
%% terminate/3 leaves its successor a worker to kill.
-spec set_worker_os_pid(integer() | undefined) -> ok.
set_worker_os_pid(OsPid) ->
    true = ets:insert(?TAB, {os_pid, OsPid}),
    ok.

-spec worker_os_pid() -> integer() | undefined.
worker_os_pid() ->
    case ets:lookup(?TAB, os_pid) of
        [{os_pid, OsPid}] -> OsPid;
        [] -> undefined
    end.

queues() ->
    maps:get(queues, status(), undefined).

store(Status) ->
    true = ets:insert(?TAB, {worker, Status}),
    %% The cluster agent tells the other nodes at once (erlcuda_cluster).
    case whereis(erlcuda_cluster) of
        undefined -> ok;
        Agent -> Agent ! {erlcuda_cluster, status}, ok
    end.
