%% erlcuda:await/1,2 (erlcuda_await): the reply of the caller's own `launch', taken from its
%% mailbox; a timeout drops the job, so that no reply comes after it; bad arguments are
%% answered at once. Device 0 is kept busy by the worker double's `stall' where a job must
%% still be waiting. CPU backend, two devices, the worker's test double (test/worker).
-module(erlcuda_await_tests).

-include_lib("eunit/include/eunit.hrl").

await_test_() ->
    erlcuda_test_util:with_app(
      erlcuda_test_util:fault_defaults(), [],
      [{"a launch's reply, once", fun reply/0},
       {"a reply already in the mailbox, and a traced one", fun already_here/0},
       {"a timeout drops the job: no reply comes after it", {timeout, 60, fun timeout/0}},
       {"a timed-out job that keeps buffers keeps none", {timeout, 60, fun timeout_keep/0}},
       {"bad arguments, another process's job, an unknown id", {timeout, 60, fun bad/0}},
       {"the jobs in flight, which decide whether a caller spins", {timeout, 60,
                                                                    fun in_flight/0}}]).

%% With `caller_spin_us' `auto' a caller spins while its job is the only one in flight, on a
%% host with cores to spare.
spin_us_test() ->
    ?assertEqual(200, erlcuda_await:spin_us(auto, 0, 16)),
    ?assertEqual(200, erlcuda_await:spin_us(auto, 1, 4)),
    ?assertEqual(0, erlcuda_await:spin_us(auto, 2, 16)),
    %% a host of few cores: the spin would take the worker's core
    ?assertEqual(0, erlcuda_await:spin_us(auto, 1, 2)),
    ?assertEqual(0, erlcuda_await:spin_us(auto, 0, 3)),
    ?assertEqual(50, erlcuda_await:spin_us(50, 1000, 2)),
    ?assertEqual(0, erlcuda_await:spin_us(0, 1, 16)).

in_flight() ->
    ?assertEqual(0, erlcuda_status:in_flight()),
    erlcuda_test_util:stall(0, 1000),
    Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[float(I)]], #{device => D}), Id end
           || {I, D} <- [{1, 0}, {2, 0}, {3, 1}]],
    %% the one on device 1 may be answered already
    ?assert(lists:member(erlcuda_status:in_flight(), [2, 3])),
    erlcuda_test_util:flush_stalled(),
    ?assertEqual([{ok, 1.0}, {ok, 2.0}, {ok, 3.0}], [erlcuda:await(Id, 10000) || Id <- Ids]),
    ?assertEqual(0, erlcuda_status:in_flight()),
    erlcuda_test_util:no_message().

reply() ->
    {ok, Id} = erlcuda:launch(vector_add, [[1.0, 2.0], [3.0, 4.0]]),
    ?assertEqual({ok, [4.0, 6.0]}, erlcuda:await(Id, 10000)),
    {ok, Id2} = erlcuda:launch(reduce, [[1.0, 2.0]], #{device => 1}),
    ?assertEqual({ok, 3.0}, erlcuda:await(Id2)),
    %% errors come back as the job's reply
    {ok, Id3} = erlcuda:launch(vector_add, [[3.0e38], [3.0e38]]),
    ?assertMatch({error, {non_finite, _}}, erlcuda:await(Id3, 10000)),
    erlcuda_test_util:no_message().

already_here() ->
    {ok, Id} = erlcuda:launch(reduce, [[5.0]]),
    {ok, Other} = erlcuda:launch(reduce, [[6.0]]),
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100),
    %% both replies are here: each await takes its own
    ?assertEqual({ok, 6.0}, erlcuda:await(Other, 0)),
    ?assertEqual({ok, 5.0}, erlcuda:await(Id, 0)),
    {ok, T} = erlcuda:launch(reduce, [[1.0]], [{trace, true}]),
    ?assertMatch({ok, 1.0, #{}}, erlcuda:await(T, 10000)),
    erlcuda_test_util:no_message().

timeout() ->
    #{jobs := #{dropped := Dropped}} = erlcuda:info(),
    erlcuda_test_util:stall(0, 1000),
    {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{device, 0}]),
    ?assertEqual({error, timeout}, erlcuda:await(Id, 50)),
    ?assertEqual(0, erlcuda_jobs:size()),
    ?assertMatch(#{jobs := #{dropped := D}} when D =:= Dropped + 1, erlcuda:info()),
    erlcuda_test_util:flush_stalled(),
    %% a job after it on the same device is answered after it would have been
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, 0}])),
    erlcuda_test_util:no_message(),
    ?assertEqual({error, timeout}, erlcuda:await(Id, 0)).

timeout_keep() ->
    erlcuda_test_util:stall(0, 1000),
    {ok, Id} = erlcuda:launch(copy, [[1.0, 2.0]], [{device, 0}, {keep, true}]),
    ?assertEqual({error, timeout}, erlcuda:await(Id, 50)),
    erlcuda_test_util:flush_stalled(),
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, 0}])),
    erlcuda_test_util:no_message(),
    ?assertEqual(0, maps:get(owned_buffers, erlcuda:info())),
    %% and one awaited in time is the caller's
    {ok, Keep} = erlcuda:launch(copy, [[1.0, 2.0]], [{keep, true}]),
    {ok, Buffer} = erlcuda:await(Keep, 10000),
    ?assertEqual({ok, [1.0, 2.0]}, erlcuda:download(Buffer)),
    ok = erlcuda:free(Buffer).

bad() ->
    ?assertMatch({error, {bad_args, _}}, erlcuda:await(job, 100)),
    ?assertMatch({error, {bad_args, _}}, erlcuda:await(0, 100)),
    ?assertEqual({error, {bad_option, {timeout, -1}}}, erlcuda:await(1, -1)),
    ?assertEqual({error, {bad_option, {timeout, soon}}}, erlcuda:await(1, soon)),
    %% a job whose reply goes to another process, still waiting on a busy device
    erlcuda_test_util:stall(0, 1000),
    Test = self(),
    Owner = spawn(fun() ->
                          {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{device, 0}]),
                          Test ! {launched, Id},
                          receive {erlcuda, Id, R} -> Test ! {owner, R} end
                  end),
    Id = receive {launched, J} -> J after 10000 -> error(not_launched) end,
    ?assertMatch({error, {bad_args, _}}, erlcuda:await(Id, 100)),
    %% it is still its owner's
    receive {owner, R} -> ?assertEqual({ok, 1.0}, R) after 10000 -> error({lost, Owner}) end,
    erlcuda_test_util:flush_stalled(),
    %% an id nobody launched waits its time out
    ?assertEqual({error, timeout}, erlcuda:await(Id + 1000000, 10)),
    erlcuda_test_util:no_message().
