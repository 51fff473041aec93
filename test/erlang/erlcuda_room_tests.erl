%% Launches that wait for room (`{wait, Ms}', erlcuda_room): with `max_queue' 1 and device 0
%% kept busy by the worker double's `stall', the one job in flight fills its queue. Waiters
%% get places in the order they came, a wait that runs out is `overloaded', a waiter that
%% dies leaves no place taken, and without the option a full queue is `overloaded' at once.
%% CPU backend, two devices, the worker's test double (test/worker).
-module(erlcuda_room_tests).

-include_lib("eunit/include/eunit.hrl").

room_test_() ->
    erlcuda_test_util:with_app(
      erlcuda_test_util:fault_defaults(), [{max_queue, 1}],
      [{"without the option, a full queue is overloaded at once",
        {timeout, 60, fun no_wait/0}},
       {"waiters get places in the order they came", {timeout, 60, fun in_order/0}},
       {"a wait that runs out is overloaded and holds no place",
        {timeout, 60, fun runs_out/0}},
       {"a waiter that dies loses its turn, not a place", {timeout, 60, fun waiter_dies/0}},
       {"a place granted to a waiter that died is given back",
        {timeout, 60, fun granted_then_dies/0}}]).

-define(DEV0, [{device, 0}]).

%% The launches waiting for room on device 0, and its jobs in flight.
waiting() ->
    erlcuda_status:waiting(maps:get(queues, erlcuda_status:status()), 0).

in_flight() ->
    erlcuda_status:in_flight(maps:get(queues, erlcuda_status:status()), 0).

%% Device 0 busy and its queue full (max_queue 1): the job that fills it.
fill(StallMs) ->
    erlcuda_test_util:stall(0, StallMs),
    {ok, Job} = erlcuda:launch(reduce, [[1.0]], ?DEV0),
    Job.

%% The stall over and the filling job answered: the queue empty again.
drain(Job) ->
    receive {erlcuda, Job, {ok, 1.0}} -> ok after 20000 -> error({lost, Job}) end,
    erlcuda_test_util:flush_stalled(),
    ok = erlcuda_test_util:wait_until(fun() -> in_flight() =:= 0 end, 100),
    ?assertEqual(0, waiting()).

no_wait() ->
    Job = fill(2000),
    ?assertEqual({error, overloaded}, erlcuda:launch(reduce, [[1.0]], ?DEV0)),
    ?assertEqual({error, overloaded}, erlcuda:launch(reduce, [[1.0]], #{device => 0, wait => 0})),
    ?assertEqual({error, overloaded}, erlcuda:launch_sync(reduce, [[1.0]], ?DEV0)),
    %% a full queue never hides a bad argument, nor waits for room to tell it: a list's
    %% range, which launch_sync checks while a job runs, is checked before either
    Range = erlcuda:launch(reduce, [[1.0e39]], ?DEV0),
    ?assertMatch({error, {bad_args, _}}, Range),
    #{submitted := Before} = erlcuda_jobs:counters(),
    ?assertEqual(Range, erlcuda:launch_sync(reduce, [[1.0e39]], ?DEV0)),
    ?assertEqual(Range, erlcuda:launch_sync(reduce, [[1.0e39]], #{device => 0, wait => 10000})),
    %% it did not wait for room: a job is counted once it has its place, and none was
    ?assertMatch(#{submitted := Before}, erlcuda_jobs:counters()),
    ?assertEqual(0, waiting()),
    %% the other device has room
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, 1}])),
    ?assertEqual({error, {bad_option, {wait, -1}}}, erlcuda:launch(reduce, [[1.0]], [{wait, -1}])),
    ?assertEqual({error, {bad_option, {wait, soon}}},
                 erlcuda:launch(reduce, [[1.0]], #{wait => soon})),
    drain(Job).

%% Five waiters, each counted in before the next comes, start their jobs (the start event
%% runs in the launching process once it has its place) in that order.
in_order() ->
    Job = fill(3000),
    Test = self(),
    Ref = make_ref(),
    ok = telemetry:attach(Ref, [erlcuda, job, start],
                          fun(_, _, _, _) -> Test ! {started, self()} end, none),
    try
        Waiters = [begin
                       Pid = spawn(fun() -> waiter(Test, I) end),
                       ok = erlcuda_test_util:wait_until(fun() -> waiting() =:= I end, 100),
                       Pid
                   end || I <- lists:seq(1, 5)],
        Started = [receive {started, P} -> P after 20000 -> none end || _ <- Waiters],
        ?assertEqual(Waiters, Started),
        ?assertEqual([{ok, float(I)} || I <- lists:seq(1, 5)],
                     [receive {done, P, R} -> R after 20000 -> lost end || P <- Waiters])
    after
        telemetry:detach(Ref)
    end,
    drain(Job).

waiter(Test, I) ->
    {ok, Job} = erlcuda:launch(reduce, [[float(I)]], [{device, 0}, {wait, 60000}]),
    receive {erlcuda, Job, Reply} -> Test ! {done, self(), Reply} end.

runs_out() ->
    Job = fill(2000),
    ?assertEqual({error, overloaded}, erlcuda:launch(reduce, [[1.0]], #{device => 0, wait => 100})),
    ?assertEqual(0, waiting()),
    %% a launch_sync waits for room at most its own timeout
    ?assertEqual({error, overloaded},
                 erlcuda:launch_sync(reduce, [[1.0]], [{device, 0}, {wait, infinity},
                                                       {timeout, 100}])),
    ?assertEqual(0, waiting()),
    ?assertEqual(1, in_flight()),
    drain(Job),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[3.0]], [{device, 0}, {wait, 1000}])),
    erlcuda_test_util:no_message().

waiter_dies() ->
    Job = fill(3000),
    Test = self(),
    Victim = spawn(fun() -> erlcuda:launch(reduce, [[1.0]], [{device, 0}, {wait, infinity}]) end),
    ok = erlcuda_test_util:wait_until(fun() -> waiting() =:= 1 end, 100),
    Next = spawn(fun() ->
                         Test ! {next, self(), erlcuda:launch_sync(
                                                 reduce, [[2.0]], [{device, 0}, {wait, 60000},
                                                                   {timeout, 60000}])}
                 end),
    ok = erlcuda_test_util:wait_until(fun() -> waiting() =:= 2 end, 100),
    exit(Victim, kill),
    ok = erlcuda_test_util:wait_until(fun() -> waiting() =:= 1 end, 100),
    %% the one behind it has the first place that frees
    receive {next, Next, R} -> ?assertEqual({ok, 2.0}, R) after 20000 -> error(lost) end,
    drain(Job).

%% A waiter granted a place that dies before it takes it (here one that speaks the room's
%% messages itself, so that it can die right then): the place is free again.
granted_then_dies() ->
    #{queues := Queues, max_queue := Max} = erlcuda_status:status(),
    Test = self(),
    Ref = make_ref(),
    {Pid, Mon} = spawn_monitor(fun() ->
                                       erlcuda_room ! {erlcuda_room, wait, Ref, self(), {Queues, 0},
                                                       Max},
                                       receive {erlcuda_room, Ref, granted} -> ok end,
                                       Test ! {holds, in_flight()},
                                       exit(died)
                               end),
    receive {holds, N} -> ?assertEqual(1, N) after 10000 -> error(not_granted) end,
    receive {'DOWN', Mon, process, Pid, died} -> ok end,
    ok = erlcuda_test_util:wait_until(fun() -> in_flight() =:= 0 end, 100),
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], ?DEV0)).
