%% Telemetry (erlcuda_telemetry): the [erlcuda, job, start | stop | exception] events a job
%% emits, through a stand-in for the optional telemetry application, and handlers that raise,
%% which must never break a launch or the port owner. CPU backend, the worker's test double
%% (test/worker).
-module(erlcuda_telemetry_tests).

-include_lib("eunit/include/eunit.hrl").

%% A telemetry stand-in whose handlers fail (telemetry_module for some tests here).
-export([execute/3]).

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%% The telemetry events, through a stand-in module for the optional telemetry application.
events_test_() ->
    with_app([{telemetry_module, erlcuda_telemetry_standin}], fun() ->
        register(erlcuda_telemetry_events, self()),
        try
            {ok, 3.0} = erlcuda:launch_sync(reduce, [[1.0, 2.0]]),
            Big = [3.0e38, 3.0e38],
            %% an async launch: its list is made (and found non-finite) before delivery
            {ok, Id} = erlcuda:launch(vector_add, [Big, Big]),
            receive {erlcuda, Id, {error, {non_finite, _}}} -> ok after 5000 -> error(no_reply) end,
            receive {telemetry, [erlcuda, job, start], #{system_time := _}, #{kernel := reduce}} -> ok
            after 1000 -> error(no_start)
            end,
            receive {telemetry, [erlcuda, job, stop], #{duration := D}, #{kernel := reduce}}
                      when is_integer(D), D >= 0 -> ok
            after 1000 -> error(no_stop)
            end,
            receive {telemetry, [erlcuda, job, exception], #{duration := _},
                     #{kernel := vector_add, reason := {non_finite, _}}} -> ok
            after 1000 -> error(no_exception)
            end,
            #{jobs := #{submitted := S, ok := Ok, error := Err}} = erlcuda:info(),
            ?assert(S >= 2 andalso Ok >= 1 andalso Err >= 1)
        after
            unregister(erlcuda_telemetry_events),
            ok = application:unset_env(erlcuda, telemetry_module)
        end
    end).

%% The telemetry contract (README, Telemetry): a job answered {ok, _} emits
%% [erlcuda, job, stop], also a launch_sync of a vector in list format, whose caller is sent
%% {f32, Bin} and makes the list itself: that result is a success, not the `reason' of an
%% [erlcuda, job, exception]. (Shared memory off, as for the other tests of protocol 3.)
sync_vector_success_emits_stop_test_() ->
    with_app([{shm_dir, none}, {telemetry_module, erlcuda_telemetry_standin}], fun() ->
        register(erlcuda_telemetry_events, self()),
        try
            ?assertEqual({ok, [3.0]}, erlcuda:launch_sync(vector_add, [[1.0], [2.0]])),
            Stop = receive
                       {telemetry, [erlcuda, job, Kind], _, #{kernel := vector_add} = Meta}
                         when Kind =/= start ->
                           {Kind, maps:get(reason, Meta, none)}
                   after 2000 -> no_event
                   end,
            ?assertEqual({stop, none}, Stop)
        after
            unregister(erlcuda_telemetry_events),
            _ = flush()
        end
    end).

%% Telemetry never breaks a launch. A [erlcuda, job, start] handler that raises must not
%% make launch/3 raise in the caller after its place in the device queue was taken: the
%% launch is answered and the queue counter comes back to 0.
start_handler_that_raises_test_() ->
    with_app([{telemetry_module, ?MODULE}], {timeout, 20, fun() ->
        R = (catch erlcuda:launch(dot_product, [[1.0], [1.0]])),
        flush(),
        _ = wait_until(fun() -> in_flight() =:= 0 end, 20),
        ?assertEqual({true, 0}, {is_reply(R), in_flight()})
    end}).

%% A [erlcuda, job, stop] handler that raises runs in the port owner after the job was
%% taken from the table and before its reply is sent: the job still gets its reply, and the
%% owner does not crash (which would restart the worker, failing every other job in flight).
stop_handler_that_raises_test_() ->
    with_app([{telemetry_module, ?MODULE}], {timeout, 20, fun() ->
        ?assertEqual({ok, [2.0]},
                     erlcuda:launch_sync(vector_add, [[1.0], [1.0]], [{timeout, 3000}]))
    end}).

%% The telemetry module of the tests above: its handlers fail for dot_product's start and
%% vector_add's stop.
execute([erlcuda, job, start], _, #{kernel := dot_product}) -> error(handler_bug);
execute([erlcuda, job, stop], _, #{kernel := vector_add}) -> error(handler_bug);
execute(_, _, _) -> ok.

is_reply({ok, _}) -> true;
is_reply({error, _}) -> true;
is_reply(_) -> false.

in_flight() -> erlcuda_test_util:in_flight().

%% A Cond that raises counts as not holding yet (erlcuda_test_util:wait_for/2).
wait_until(Cond, N) -> erlcuda_test_util:wait_for(Cond, N).

flush() -> erlcuda_test_util:flush().
