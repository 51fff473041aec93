%% The per-device queue counters (erlcuda_status), outside the application: how the port
%% owner's settle/2 gives back a place that no registered job holds, and only such a place.
-module(erlcuda_status_tests).

-include_lib("eunit/include/eunit.hrl").

settle_test_() ->
    {setup, fun set_up/0, fun tear_down/1, fun(_) -> {timeout, 30, fun settle/0} end}.

set_up() ->
    ok = erlcuda_status:create(),
    Port = open_port({spawn, "cat"}, []),
    ok = erlcuda_status:set_up(Port, {self(), erlcuda_writer:new_counters()}, 2, 10, none, 1),
    Port.

tear_down(Port) ->
    port_close(Port),
    ets:delete(erlcuda_status).

%% A count is put to zero only once it stayed the same for a second with no place taken on
%% its device and nothing registered; a place that changed hands meanwhile (given back and
%% taken again: the same count) stays, as does a count while `Idle' says jobs are
%% registered. Device 1's count is never touched. A count below zero is put right alike.
settle() ->
    Status = erlcuda_status:status(),
    #{queues := Q} = Status,
    Idle = fun() -> true end,
    %% in flight as counted, below zero too (in_flight/2 shows no less than zero): three
    %% counters a device, in flight first
    Raw = fun(D) -> atomics:get(Q, 3 * D + 1) end,
    ok = erlcuda_status:enqueue(Status, 0),
    ok = erlcuda_status:enqueue(Status, 1),
    ok = erlcuda_status:dequeue(Q, 1),
    S1 = erlcuda_status:settle(#{}, Idle),
    timer:sleep(1100),
    ok = erlcuda_status:dequeue(Q, 0),
    ok = erlcuda_status:enqueue(Status, 0),
    S2 = erlcuda_status:settle(S1, Idle),
    ?assertEqual(1, Raw(0)),
    timer:sleep(1100),
    S3 = erlcuda_status:settle(S2, fun() -> false end),
    ?assertEqual(1, Raw(0)),
    _ = erlcuda_status:settle(S3, Idle),
    ?assertEqual({0, 0}, {Raw(0), Raw(1)}),
    ok = erlcuda_status:dequeue(Q, 0),
    S4 = erlcuda_status:settle(#{}, Idle),
    ?assertEqual(-1, Raw(0)),
    timer:sleep(1100),
    _ = erlcuda_status:settle(S4, Idle),
    ?assertEqual(0, Raw(0)),
    %% a full queue whose places nobody holds, with launches refused all the while: a
    %% refusal takes no place, so the places are given back all the same
    [ok = erlcuda_status:enqueue(Status, 0) || _ <- lists:seq(1, 10)],
    S5 = erlcuda_status:settle(#{}, Idle),
    ?assertEqual(overloaded, erlcuda_status:enqueue(Status, 0)),
    timer:sleep(1100),
    ?assertEqual(overloaded, erlcuda_status:enqueue(Status, 0)),
    _ = erlcuda_status:settle(S5, Idle),
    ?assertEqual(0, Raw(0)).
