%% Telemetry (erlcuda_telemetry, erlcuda_events): the job, worker and compile events, their
%% measurements and metadata, and which process runs their handlers: the process that
%% waits (launch_sync, await, load) or erlcuda's event process, never the port owner, so a
%% handler that blocks or raises never holds up or loses a reply. Handlers are attached
%% through the test profile's `telemetry' module (test/erlang/telemetry.erl). CPU backend,
%% the worker's test double (test/worker).
-module(erlcuda_telemetry_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, erlcuda_test_util:fault_defaults()).
-define(JOB_EVENTS, [[erlcuda, job, start], [erlcuda, job, stop], [erlcuda, job, exception]]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%% Every event attached to, sent to the test process with the pid that ran the handler.
forward(Events) ->
    Test = self(),
    Id = make_ref(),
    ok = telemetry:attach_many(Id, Events,
                               fun(E, M, Meta, _) -> Test ! {event, E, M, Meta, self()} end,
                               none),
    Id.

next_event(Event) ->
    receive {event, Event, M, Meta, Pid} -> {M, Meta, Pid}
    after 10000 -> error({no_event, Event})
    end.

%% A launch_sync's start and stop run in its caller, with what the job moves.
sync_job_events_test_() ->
    with_app([], fun() ->
        Id = forward(?JOB_EVENTS),
        try
            ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]])),
            {#{system_time := _, monotonic_time := T0}, Start, P1} =
                next_event([erlcuda, job, start]),
            {#{duration := D, monotonic_time := T1}, Stop, P2} = next_event([erlcuda, job, stop]),
            ?assertEqual({self(), self()}, {P1, P2}),
            ?assert(is_integer(D) andalso D >= 0 andalso T1 >= T0),
            ?assertMatch(#{kernel := reduce, device := 0, bytes_in := 8, bytes_out := 8,
                           elements := 2, job_id := J} when is_integer(J), Start),
            ?assertEqual(Start, Stop),
            %% a vector result that the caller makes into floats itself is a stop, not an
            %% exception, and says the bytes it brings back
            ?assertEqual({ok, [4.0, 6.0, 8.0]},
                         erlcuda:launch_sync(vector_add, [[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])),
            {_, #{bytes_in := 24, bytes_out := 12, elements := 3}, _} =
                next_event([erlcuda, job, stop])
        after
            telemetry:detach(Id)
        end
    end).

%% A plain launch whose caller does not wait has its stop (or exception) event run by the
%% event process, after its reply.
plain_launch_events_test_() ->
    with_app([], fun() ->
        Id = forward(?JOB_EVENTS),
        try
            Big = [3.0e38, 3.0e38],
            {ok, Job} = erlcuda:launch(vector_add, [Big, Big]),
            receive {erlcuda, Job, {error, {non_finite, _}}} -> ok
            after 10000 -> error(no_reply)
            end,
            {_, #{job_id := Job}, Caller} = next_event([erlcuda, job, start]),
            {#{duration := _}, Meta, Runner} = next_event([erlcuda, job, exception]),
            ?assertEqual(self(), Caller),
            ?assertEqual(whereis(erlcuda_events), Runner),
            ?assertMatch(#{job_id := Job, kind := error, reason := {non_finite, _}}, Meta),
            #{jobs := #{submitted := S, error := Err}} = erlcuda:info(),
            ?assert(S >= 1 andalso Err >= 1)
        after
            telemetry:detach(Id)
        end
    end).

%% await/2 runs the stop event in the caller that waits, and only there.
await_runs_the_stop_event_test_() ->
    with_app([], fun() ->
        Id = forward(?JOB_EVENTS),
        try
            {ok, Job} = erlcuda:launch(dot_product, [[1.0, 2.0], [3.0, 4.0]]),
            ?assertEqual({ok, 11.0}, erlcuda:await(Job, 10000)),
            {_, #{job_id := Job}, Pid} = next_event([erlcuda, job, stop]),
            ?assertEqual(self(), Pid),
            %% no second event, from the event process or anywhere (once it has run what it
            %% was sent before this call)
            _ = sys:get_state(erlcuda_events),
            receive {event, [erlcuda, job, E], _, _, _} when E =/= start -> error({twice, E})
            after 0 -> ok
            end
        after
            telemetry:detach(Id)
        end
    end).

%% A launch_sync caller killed in its wait: its job's one event is run by the event process,
%% when its reply comes (stop) or when the sweep of dead callers drops it first (exception,
%% caller_down).
killed_waiter_test_() ->
    with_app([], {timeout, 60, fun() ->
        Id = forward(?JOB_EVENTS),
        try
            erlcuda_test_util:stall(0, 300),
            Killed = spawn(fun() -> erlcuda:launch_sync(reduce, [[1.0]], [{device, 0},
                                                                           {timeout, 60000}]) end),
            {_, #{job_id := K}, Killed} = next_event([erlcuda, job, start]),
            exit(Killed, kill),
            erlcuda_test_util:flush_stalled(),
            ?assertMatch([{E, K}] when E =:= stop; E =:= exception, after_device_0([K]))
        after
            telemetry:detach(Id)
        end
    end}).

%% A launch_sync that timed out has had its exception (timeout), and no second event when
%% its job is answered after it exited.
quitter_test_() ->
    with_app([], {timeout, 60, fun() ->
        Id = forward(?JOB_EVENTS),
        try
            erlcuda_test_util:stall(0, 1000),
            {Quitter, Mon} = spawn_monitor(fun() ->
                                                   exit(erlcuda:launch_sync(reduce, [[2.0]],
                                                                            [{device, 0},
                                                                             {timeout, 50}]))
                                           end),
            {_, #{job_id := Q}, Quitter} = next_event([erlcuda, job, start]),
            receive {'DOWN', Mon, process, Quitter, R} -> ?assertEqual({error, timeout}, R) end,
            {_, #{job_id := Q, reason := timeout}, Quitter} = next_event([erlcuda, job, exception]),
            erlcuda_test_util:flush_stalled(),
            ?assertEqual([], after_device_0([Q]))
        after
            telemetry:detach(Id)
        end
    end}).

%% A launch_sync whose f32 list holds a number beyond the range is refused after its job
%% was submitted (the range is checked while the worker runs it): its start and an
%% exception with the bad_args reason, in the caller, and no second event when its job is
%% answered. A launch refused before it is submitted emits nothing.
range_refused_after_submit_test_() ->
    with_app([], {timeout, 60, fun() ->
        Id = forward(?JOB_EVENTS),
        try
            {error, Why} = erlcuda:launch_sync(reduce, [[1.0, 1.0e39]], [{device, 0}]),
            {_, #{job_id := J}, Self} = next_event([erlcuda, job, start]),
            ?assertEqual(self(), Self),
            ?assertMatch({_, #{job_id := J, kind := error, reason := Why}, Self},
                         next_event([erlcuda, job, exception])),
            ?assertEqual([], after_device_0([J])),
            ?assertMatch({error, {bad_args, _}}, erlcuda:launch_sync(reduce, [[foo]])),
            ?assertMatch({error, {bad_args, _}}, erlcuda:launch(reduce, [[1.0e39]])),
            ?assertEqual([], [E || {event, _, _, _, _} = E <- erlcuda_test_util:flush()])
        after
            telemetry:detach(Id)
        end
    end}).

%% The job events of `Jobs' run by the event process by the time a job behind them on
%% device 0 is answered (their replies, and so their events, were sent before its reply).
after_device_0(Jobs) ->
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[3.0]], [{device, 0}])),
    _ = sys:get_state(erlcuda_events),
    Events = whereis(erlcuda_events),
    [{E, J} || {event, [erlcuda, job, E], _, #{job_id := J}, P} <- erlcuda_test_util:flush(),
               lists:member(J, Jobs), P =:= Events].

%% With nobody attached, the port owner sends the event process nothing at all.
nothing_sent_without_listeners_test_() ->
    with_app([], fun() ->
        Events = whereis(erlcuda_events),
        ok = sys:suspend(Events),
        try
            Ids = [Job || _ <- lists:seq(1, 20),
                          {ok, Job} <- [erlcuda:launch(reduce, [[1.0]])]],
            [receive {erlcuda, Job, {ok, 1.0}} -> ok after 10000 -> error(lost) end
             || Job <- Ids],
            ?assertEqual({message_queue_len, 0},
                         erlang:process_info(Events, message_queue_len)),
            %% attached, each plain launch's stop goes there
            Id = forward([[erlcuda, job, stop]]),
            {ok, Job} = erlcuda:launch(reduce, [[1.0]]),
            receive {erlcuda, Job, {ok, 1.0}} -> ok after 10000 -> error(lost) end,
            ?assertEqual(ok, erlcuda_test_util:wait_until(
                               fun() -> element(2, erlang:process_info(
                                                     Events, message_queue_len)) =:= 1 end,
                               100)),
            telemetry:detach(Id)
        after
            sys:resume(Events)
        end
    end).

%% A stop handler that blocks for ever holds up no reply: the blocked handler runs in the
%% event process, whose other events wait for it, and none is dropped.
blocking_handler_test_() ->
    with_app([], {timeout, 120, fun() ->
        Test = self(),
        Ref = make_ref(),
        ok = telemetry:attach(Ref, [erlcuda, job, stop],
                              fun(_, _, #{kernel := reduce}, _) ->
                                      Test ! {blocked, self()},
                                      receive {Ref, release} -> ok end;
                                 (_, _, _, _) -> ok
                              end, none),
        {ok, Id} = erlcuda:launch(reduce, [[1.0, 2.0]]),
        receive {erlcuda, Id, R} -> ?assertEqual({ok, 3.0}, R) after 10000 -> error(no_reply) end,
        Blocked = receive {blocked, P} -> P after 10000 -> error(not_run) end,
        Forward = forward([[erlcuda, job, stop]]),
        Plain = try
            ?assertNotEqual(whereis(erlcuda_worker), Blocked),
            %% callers that wait, with their own handlers' events, and plain launches
            Callers = [spawn_monitor(fun() ->
                                             exit(erlcuda:launch_sync(vector_add, [[1.0], [2.0]],
                                                                      [{timeout, 10000}]))
                                     end) || _ <- lists:seq(1, 20)],
            Results = [receive {'DOWN', M, process, Pid, Why} -> Why end || {Pid, M} <- Callers],
            ?assertEqual(lists:duplicate(20, {ok, [3.0]}), Results),
            Jobs = [Job || _ <- lists:seq(1, 20),
                           {ok, Job} <- [erlcuda:launch(vector_add, [[1.0], [1.0]])]],
            ?assertEqual(lists:duplicate(20, {ok, [2.0]}),
                         [receive {erlcuda, Job, Reply} -> Reply after 10000 -> lost end
                          || Job <- Jobs]),
            %% the plain launches' events wait behind the blocked handler
            ?assertEqual([], [J || J <- Jobs, stop_seen(J)]),
            Jobs
        after
            Blocked ! {Ref, release},
            telemetry:detach(Ref)
        end,
        %% released, every one of them is run
        ?assertEqual(ok, stops(Plain)),
        telemetry:detach(Forward)
    end}).

stop_seen(Job) ->
    receive {event, [erlcuda, job, stop], _, #{job_id := Job}, _} = E -> self() ! E, true
    after 0 -> false
    end.

stops([]) -> ok;
stops([Job | Rest]) ->
    receive {event, [erlcuda, job, stop], _, #{job_id := Job}, _} -> stops(Rest)
    after 10000 -> {missing, Job}
    end.

%% A launch its device's queue has no room for is refused at once, with no event; the job
%% in the queue has its own start and stop.
overloaded_launch_events_test_() ->
    with_app([{max_queue, 1}], {timeout, 30, fun() ->
        Id = forward(?JOB_EVENTS),
        try
            erlcuda_test_util:stall(0, 2000),
            {ok, First} = erlcuda:launch(reduce, [[1.0]], [{device, 0}]),
            {_, #{job_id := First}, _} = next_event([erlcuda, job, start]),
            ?assertEqual({error, overloaded}, erlcuda:launch(reduce, [[1.0]], [{device, 0}])),
            receive {erlcuda, First, R} -> ?assertEqual({ok, 1.0}, R)
            after 10000 -> error(lost)
            end,
            {_, #{job_id := First}, _} = next_event([erlcuda, job, stop]),
            ?assertEqual([], [E || {event, _, _, _, _} = E <- erlcuda_test_util:flush()])
        after
            telemetry:detach(Id)
        end
    end}).

%% A start handler runs once its job is registered, so a worker going down meanwhile answers
%% the job before its span is in the job's entry: the launching process then runs the
%% job's exception event itself, once.
worker_down_in_a_start_handler_test_() ->
    with_app([], {timeout, 60, fun() ->
        #{worker_os_pid := Os} = erlcuda:info(),
        Ref = make_ref(),
        ok = telemetry:attach(Ref, [erlcuda, job, start],
                              fun(_, _, _, _) ->
                                      erlcuda_test_util:kill9(Os),
                                      ok = erlcuda_test_util:wait_until(
                                             fun() -> erlcuda_jobs:size() =:= 0 end, 100)
                              end, none),
        Id = forward(?JOB_EVENTS),
        try
            {ok, Job} = erlcuda:launch(reduce, [[1.0]]),
            receive {erlcuda, Job, R} -> ?assertMatch({error, {worker_down, _}}, R)
            after 10000 -> error(lost)
            end,
            {_, #{job_id := Job}, _} = next_event([erlcuda, job, start]),
            {_, #{job_id := Job, reason := {worker_down, _}}, P} =
                next_event([erlcuda, job, exception]),
            ?assertEqual(self(), P),
            ?assertEqual([], [E || {event, _, _, #{job_id := J}, _} = E <- wait_flush(),
                                   J =:= Job])
        after
            telemetry:detach(Ref),
            telemetry:detach(Id)
        end,
        erlcuda_test_util:wait_restarted(Os, 100)
    end}).

%% What reaches this process within half a second.
wait_flush() ->
    timer:sleep(500),
    erlcuda_test_util:flush().

%% Handlers that raise never break a launch: the start handler runs in the caller after
%% its place in the queue was taken, the stop handler where the reply is awaited; each
%% launch is answered and the queue counter comes back to 0.
handlers_that_raise_test_() ->
    with_app([], {timeout, 30, fun() ->
        Id = make_ref(),
        ok = telemetry:attach_many(Id, ?JOB_EVENTS, fun(_, _, _, _) -> error(handler_bug) end,
                                   none),
        try
            R = (catch erlcuda:launch(dot_product, [[1.0], [1.0]])),
            ?assertMatch({ok, _}, R),
            {ok, Job} = R,
            receive {erlcuda, Job, {ok, 1.0}} -> ok after 10000 -> error(lost) end,
            ok = telemetry:attach_many(Id, ?JOB_EVENTS,
                                       fun(_, _, _, _) -> error(handler_bug) end, none),
            ?assertEqual({ok, [2.0]}, erlcuda:launch_sync(vector_add, [[1.0], [1.0]])),
            ?assertEqual(ok, erlcuda_test_util:wait_for(
                               fun() -> erlcuda_test_util:in_flight() =:= 0 end, 50))
        after
            telemetry:detach(Id)
        end
    end}).

%% The worker's life: down (with the reason), restart, then start (a new OS pid, its
%% backend and devices), run by the event process.
worker_events_test_() ->
    with_app([], {timeout, 120, fun() ->
        Id = forward([[erlcuda, worker, E] || E <- [start, down, restart, stop]]),
        try
            #{worker_os_pid := Old} = erlcuda:info(),
            erlcuda_test_util:kill9(Old),
            {#{duration := Life}, Down, P1} = next_event([erlcuda, worker, down]),
            ?assertMatch(#{os_pid := Old, backend := cpu, reason := {exit_status, _}}, Down),
            ?assert(is_integer(Life) andalso Life >= 0),
            {#{backoff := _}, #{restarts := N, reason := {exit_status, _}}, P2} =
                next_event([erlcuda, worker, restart]),
            ?assert(N >= 1),
            {#{duration := _, system_time := _}, Start, P3} =
                next_event([erlcuda, worker, start]),
            ?assertMatch(#{backend := cpu, devices := 2, status := up, restarts := N}, Start),
            ?assertNotEqual(Old, maps:get(os_pid, Start)),
            Events = whereis(erlcuda_events),
            ?assertEqual([Events, Events, Events], [P1, P2, P3])
        after
            telemetry:detach(Id)
        end
    end}).

%% A load's compile event runs in its caller and says whether the cache held the image (a
%% second load of the same source always finds it): g++ builds it for the cpu backend;
%% without g++ there is no compile, and so no event.
compile_events_test_() ->
    with_app([], {timeout, 300, fun() ->
        Id = forward([[erlcuda, compile, stop]]),
        try
            Load = fun() -> erlcuda:elementwise(twice_ev, [{x, f32}], [{y, f32}],
                                                <<"y = 2 * x">>) end,
            case os:find_executable("g++") of
                false ->
                    ?assertMatch({error, {backend_unavailable, _}}, Load()),
                    receive {event, _, _, _, _} = E -> error({unexpected, E}) after 0 -> ok end;
                _ ->
                    ?assertEqual(ok, Load()),
                    ?assertEqual(ok, Load()),
                    {#{duration := D1}, First, P1} = next_event([erlcuda, compile, stop]),
                    {#{duration := D2}, Second, P2} = next_event([erlcuda, compile, stop]),
                    ?assertEqual({self(), self()}, {P1, P2}),
                    ?assert(is_integer(D1) andalso D1 >= 0 andalso is_integer(D2)),
                    ?assertMatch(#{module := twice_ev, cache_hit := Hit, result := ok}
                                   when is_boolean(Hit), First),
                    ?assertMatch(#{cache_hit := true}, Second),
                    ok = erlcuda:unload(twice_ev)
            end
        after
            telemetry:detach(Id)
        end
    end}).
