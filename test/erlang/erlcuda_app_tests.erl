%% The whole application under load and faults, on the CPU backend with four devices: 1,000
%% callers x 100 mixed jobs twice (one right reply each, memory flat between rounds), SIGKILL
%% of the worker under load, overload of one device's queue, callers that die with jobs in
%% flight, and absurd sizes.
-module(erlcuda_app_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 4}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).
%% every key a test changes is listed above, so each test starts from the defaults

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

load_test_() ->
    with_app([], {timeout, 300, fun load/0}).

kill_under_load_test_() ->
    with_app([], {timeout, 120, fun kill_under_load/0}).

overload_test_() ->
    with_app([{max_queue, 5}], {timeout, 30, fun overload/0}).

caller_dies_test_() ->
    with_app([], {timeout, 30, fun caller_dies/0}).

killed_in_a_start_handler_test_() ->
    with_app([{max_queue, 3}], {timeout, 60, fun killed_in_a_start_handler/0}).

place_owed_to_no_job_test_() ->
    with_app([{max_queue, 3}], {timeout, 60, fun place_owed_to_no_job/0}).

absurd_sizes_test_() ->
    with_app([], fun absurd_sizes/0).

%% 1,000 processes x 100 jobs, mixed kernels and sizes, random devices: every job gets
%% exactly one reply, the right one; memory stays bounded across rounds.
load() ->
    First = erlcuda_load:run(#{processes => 1000, jobs => 100}),
    ?debugFmt("load: ~p", [maps:without([errors], First)]),
    ?assertMatch(#{jobs := 100000, replies := 100000, right := 100000, wrong := 0, lost := 0,
                   duplicated := 0}, First),
    %% the jobs spread over the four devices, and batches formed under the load
    #{device_info := Devices} = erlcuda:info(),
    Jobs = [maps:get(jobs, D) || D <- Devices],
    Launches = lists:sum([maps:get(launches, D) || D <- Devices]),
    ?debugFmt("jobs per device ~p in ~b launches, largest batches ~p",
              [Jobs, Launches, [maps:get(max_batch, D) || D <- Devices]]),
    ?assertEqual(4, length([J || J <- Jobs, J > 10000])),
    ?assert(Launches < lists:sum(Jobs)),
    Second = erlcuda_load:run(#{processes => 1000, jobs => 100}),
    ?assertMatch(#{right := 100000, lost := 0, duplicated := 0}, Second),
    #{memory := #{'after' := A1}} = First,
    #{memory := #{'after' := A2}} = Second,
    ?debugFmt("memory after round 1: ~p, after round 2: ~p", [A1, A2]),
    ?assert(maps:get(node, A2) < maps:get(node, A1) + 64 bsl 20),
    ?assert(maps:get(worker, A2) < maps:get(worker, A1) + 64 bsl 20),
    ?assertEqual(0, erlcuda_jobs:size()).

kill_under_load() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    R = erlcuda_load:run(#{processes => 300, jobs => 100, kill_after_ms => 150}),
    ?debugFmt("kill under load: ~p", [R]),
    #{jobs := Jobs, replies := Replies, right := Right, errors := Errors} = R,
    ?assertMatch(#{wrong := 0, lost := 0, duplicated := 0}, R),
    ?assertEqual(Jobs, Replies),
    ?assertEqual(Jobs, Right + lists:sum(maps:values(Errors))),
    ?assert(maps:get(worker_down, Errors, 0) > 0),
    erlcuda_test_util:wait_restarted(Pid, 100),
    ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]])),
    ?assertEqual(0, erlcuda_jobs:size()).

overload() ->
    erlcuda_test_util:stall(0, 500),
    Results = [erlcuda:launch(reduce, [[1.0]], [{device, 0}]) || _ <- lists:seq(1, 8)],
    {Ok, Over} = lists:partition(fun(R) -> element(1, R) =:= ok end, Results),
    ?assertEqual(5, length(Ok)),
    ?assertEqual(lists:duplicate(3, {error, overloaded}), Over),
    %% the other devices are not affected
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{device, 1}])),
    [receive {erlcuda, Id, R} -> ?assertEqual({ok, 1.0}, R) after 5000 -> error(lost) end
     || {ok, Id} <- Ok],
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{device, 0}])).

caller_dies() ->
    erlcuda_test_util:stall(0, 300),
    Caller = spawn(fun() ->
                           [{ok, _} = erlcuda:launch(reduce, [[1.0]], [{device, 0}])
                            || _ <- lists:seq(1, 100)],
                           exit(normal)
                   end),
    Ref = monitor(process, Caller),
    receive {'DOWN', Ref, process, Caller, normal} -> ok after 5000 -> error(caller) end,
    ?assert(erlcuda_jobs:size() > 0),
    wait_empty(50),
    #{device_info := Devices} = erlcuda:info(),
    ?assertEqual([0, 0, 0, 0], [maps:get(in_flight, D) || D <- Devices]).

%% Callers killed while a job start handler (the users' code, any time it likes) runs in
%% them leave no place taken in their device's queue: a full queue's worth of them, and
%% once the port owner's sweep has dropped their jobs the device takes a full queue again.
killed_in_a_start_handler() ->
    Test = self(),
    Ref = make_ref(),
    ok = telemetry:attach(Ref, [erlcuda, job, start],
                          fun(_, _, _, _) ->
                                  Test ! {in_handler, self()},
                                  receive after infinity -> ok end
                          end,
                          none),
    try
        [begin
             Caller = spawn(fun() -> erlcuda:launch(reduce, [[1.0]], [{device, 0}]) end),
             receive {in_handler, Caller} -> exit(Caller, kill)
             after 10000 -> error(no_start_event)
             end
         end || _ <- lists:seq(1, 3)]
    after
        telemetry:detach(Ref)
    end,
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100),
    Ids = [Id || {ok, Id} <- [erlcuda:launch(reduce, [[1.0]], [{device, 0}])
                               || _ <- lists:seq(1, 3)]],
    ?assertEqual(3, length(Ids)),
    [receive {erlcuda, Id, R} -> ?assertEqual({ok, 1.0}, R) after 10000 -> error(lost) end
     || Id <- Ids],
    ?assertEqual(0, erlcuda_status:in_flight()).

%% A place in a device's queue that no registered job holds (its caller killed between
%% taking the place and registering its job: nothing else would give it back) is given back
%% once it stayed so over a whole sweep of the port owner, and the device takes jobs again.
place_owed_to_no_job() ->
    Status = erlcuda_status:status(),
    [ok = erlcuda_status:enqueue(Status, 0) || _ <- lists:seq(1, 3)],
    ?assertEqual({error, overloaded}, erlcuda:launch(reduce, [[1.0]], [{device, 0}])),
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_status:in_flight() =:= 0 end, 100),
    ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]], [{device, 0}])).

absurd_sizes() ->
    Big = 1 bsl 40,
    [?assertMatch({error, {bad_args, _}}, erlcuda:launch(matmul, Args))
     || Args <- [[[], [], Big, Big, 0], [[1.0], [1.0], Big, 1, 1], [[1.0], [1.0], -1, 1, 1],
                 [[1.0], [1.0], 1, 1, 1.5], [[1.0], [1.0], 1, one, 1],
                 [[], [], 1 bsl 31, 1 bsl 31, 0]]],
    ?assertEqual({ok, [2.0]}, erlcuda:launch_sync(vector_add, [[1.0], [1.0]])).

wait_empty(0) -> error(jobs_left);
wait_empty(N) ->
    case erlcuda_jobs:size() of
        0 -> ok;
        _ -> timer:sleep(100), wait_empty(N - 1)
    end.
