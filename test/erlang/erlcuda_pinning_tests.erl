%% The worker's registrations of shared-memory files (python/erlcuda/slots.py: slots, for
%% operands and results, from their second use), followed through a double of the registration
%% calls (the test worker with ERLCUDA_TEST_PIN set: the CPU backend's devices count what
%% they register, and info/0 shows it) on every way a job ends. Files are kept for a minute
%% here, so that what goes, goes with its job, not with idleness.
-module(erlcuda_pinning_tests).

-include_lib("eunit/include/eunit.hrl").

-define(N, 10000).  % 40 KB vectors: one part (1 MiB) each, in shared memory
-define(MIB, 1048576).
-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"},
                   {python_path, []}, {shm_dir, auto}, {shm_threshold, auto},
                   {shm_keep_ms, 10000}]).

pinning_test_() ->
    {setup,
     fun() -> os:putenv("ERLCUDA_TEST_PIN", "1") end,
     fun(_) -> os:unsetenv("ERLCUDA_TEST_PIN") end,
     erlcuda_test_util:with_app(
       ?DEFAULTS, [{worker_module, "erlcuda_testworker"},
                   {python_path, erlcuda_test_util:test_worker_path()},
                   {shm_threshold, 4096}, {shm_keep_ms, 60000}],
       [{timeout, 60, fun reply_keeps_them_for_the_next_job/0},
        {timeout, 60, fun caller_death_drops_its_slots/0},
        {timeout, 60, fun timed_out_keep_drops_its_slots/0},
        {timeout, 60, fun worker_death_drops_them_all/0}])}.

vec(N, Scale) ->
    << <<(float(I * Scale)):32/float-little>> || I <- lists:seq(1, N) >>.

pinned() ->
    #{device_info := [Device]} = erlcuda:info(),
    maps:get(pinned_bytes, Device).

%% Two operand slots and a result slot, registered from their second use: three MiB, the
%% same however many jobs of that size follow (the registrations are kept for the next job).
reply_keeps_them_for_the_next_job() ->
    A = vec(?N, 1), B = vec(?N, 2),
    [?assertEqual({ok, vec(?N, 3)}, erlcuda:launch_sync(vector_add, [A, B],
                                                        [{format, binary}]))
     || _ <- lists:seq(1, 2)],
    ?assertEqual(3 * ?MIB, pinned()),
    [{ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}])
     || _ <- lists:seq(1, 10)],
    ?assertEqual(3 * ?MIB, pinned()).

%% A caller that dies with its job waiting: its slots (its result slot too) are deleted,
%% and the worker drops their registrations once it sees their files gone.
caller_death_drops_its_slots() ->
    ?assertEqual(3 * ?MIB, pinned()),
    ?assert(died_waiting(5)),
    ?assertEqual(ok, erlcuda_test_util:wait_for(fun() -> pinned() =:= 0 end, 50)).

%% A caller killed while its job waits behind a stalled device: true once its job was
%% dropped for its caller's death; else (its job answered before the caller died, its
%% slots then kept for the next job) again.
died_waiting(0) ->
    false;
died_waiting(Tries) ->
    Dropped = fun() -> #{jobs := #{dropped := D}} = erlcuda:info(), D end,
    Before = Dropped(),
    erlcuda_test_util:stall(0, 800),
    Self = self(),
    Caller = spawn(fun() ->
                           {ok, _} = erlcuda:launch(vector_add, [vec(?N, 1), vec(?N, 2)]),
                           Self ! launched,
                           timer:sleep(infinity)
                   end),
    receive launched -> ok after 5000 -> error(not_launched) end,
    exit(Caller, kill),
    erlcuda_test_util:flush_stalled(),
    case erlcuda_test_util:wait_for(fun() -> Dropped() > Before end, 20) of
        ok -> true;
        timeout -> died_waiting(Tries - 1)
    end.

%% launch_sync that keeps its result and gives up: the job is taken back, its slots are
%% deleted, and their registrations go.
timed_out_keep_drops_its_slots() ->
    A = vec(?N, 1), B = vec(?N, 2),
    [{ok, _} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary}])
     || _ <- lists:seq(1, 2)],
    ?assertEqual(3 * ?MIB, pinned()),
    erlcuda_test_util:stall(0, 800),
    ?assertEqual({error, timeout},
                 erlcuda:launch_sync(vector_add, [A, B], [{keep, true}, {timeout, 100}])),
    erlcuda_test_util:flush_stalled(),
    ?assertEqual(ok, erlcuda_test_util:wait_for(fun() -> pinned() =:= ?MIB end, 50)).

%% A worker killed: whatever it had registered goes with its process; the new worker has
%% registered nothing, and the old folder is gone.
worker_death_drops_them_all() ->
    A = vec(?N, 1),
    [{ok, _} = erlcuda:launch_sync(vector_add, [A, A], [{format, binary}])
     || _ <- lists:seq(1, 2)],
    ?assert(pinned() > 0),
    #{worker_os_pid := Old} = erlcuda:info(),
    erlcuda_test_util:kill9(Old),
    erlcuda_test_util:wait_restarted(Old, 100),
    ?assertEqual(0, pinned()),
    ?assertEqual({ok, vec(?N, 2)}, erlcuda:launch_sync(vector_add, [A, A], [{format, binary}])).
