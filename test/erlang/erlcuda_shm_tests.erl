%% Large operands and results through shared memory, and that every way a job, a worker or
%% a node ends leaves no file behind. The folders go under a base of the test's own (the
%% `shm_dir' setting), with a threshold of 4 KiB so that 10,000-element vectors use it.
%% Slots (operands' and results') are kept from job to job for `shm_keep_ms' (300 ms here):
%% a job leaves none of its own files, and nothing at all is left once that passed.
-module(erlcuda_shm_tests).

-include_lib("eunit/include/eunit.hrl").
-include_lib("kernel/include/file.hrl").
-include("erlcuda_contract.hrl").

-define(N, 10000).
-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"}, {python_path, []}, {shm_dir, auto},
                   {shm_threshold, 1048576}]).

base() ->
    filename:join("/tmp", "erlcuda-shm-tests-" ++ os:getpid()).

with_app(Test) ->
    Base = base(),
    _ = file:del_dir_r(Base),
    ok = file:make_dir(Base),
    erlcuda_test_util:with_app(?DEFAULTS, [{worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {shm_dir, Base},
                                           {shm_threshold, 4096}, {shm_keep_ms, 300}], Test).

shm_test_() ->
    %% The base goes afterwards: each run makes one of its own.
    {setup, fun() -> ok end, fun(_) -> file:del_dir_r(base()) end,
     with_app([{timeout, 60, fun results_through_files/0},
               {timeout, 60, fun operands_wait_in_files_until_mapped/0},
               {timeout, 60, fun vectors_in_several_parts/0},
               {timeout, 60, fun slots_are_written_again/0},
               {timeout, 60, fun results_sent_by_their_part/0},
               {timeout, 60, fun killed_worker_leaves_no_file/0},
               {timeout, 60, fun killed_worker_answered_results_delivered/0},
               {timeout, 60, fun killed_caller_leaves_no_file/0},
               {timeout, 60, fun timed_out_caller_leaves_no_file/0},
               {timeout, 60, fun timed_out_caller_lets_slots_go_at_once/0},
               {timeout, 60, fun replies_keep_their_order/0},
               {timeout, 60, fun planted_operand_files_are_never_followed/0},
               {timeout, 60, fun without_room_the_pipe_carries_it/0},
               {timeout, 60, fun stop_leaves_no_folder/0}])}.

vec(N, Scale) ->
    << <<(float(I * Scale)):32/float-little>> || I <- lists:seq(1, N) >>.

%% Every file in the base, in any worker's folder (but the worker's lock).
files() ->
    lists:append([[filename:join(F, N) || N <- element(2, file:list_dir(F)), N =/= ".lock"]
                  || F <- folders()]).

%% The files of the slots taken by jobs now, sorted; and the slots' part counts.
claimed_files() ->
    [Folder] = folders(),
    lists:sort([filename:join(Folder, binary_to_list(Name) ++ "." ++ integer_to_list(K))
                || {_, _, #{name := Name, parts := Parts}} <- ets:tab2list(erlcuda_shm_claimed),
                   K <- lists:seq(0, length(Parts) - 1)]).

%% Files of jobs (their own operand files `i*'): none once they are answered.
job_files() ->
    [F || F <- files(), hd(filename:basename(F)) =:= $i].

folders() ->
    filelib:wildcard(filename:join(base(), "erlcuda-*")).

results_through_files() ->
    A = vec(?N, 1), B = vec(?N, 2),
    Want = vec(?N, 3),
    ?assertEqual({ok, Want}, erlcuda:launch_sync(vector_add, [A, B], [{format, binary}])),
    {ok, List} = erlcuda:launch_sync(vector_add, [A, B]),
    ?assertEqual(erlcuda_protocol:f32_list(Want), {ok, List}),
    {ok, Id} = erlcuda:launch(vector_add, [A, B], [{format, list}]),
    receive {erlcuda, Id, Got} -> ?assertEqual({ok, List}, Got) after 10000 -> error(timeout) end,
    {ok, Id2} = erlcuda:launch(vector_add, [A, B], [{format, binary}]),
    receive {erlcuda, Id2, Got2} -> ?assertEqual({ok, Want}, Got2) after 10000 -> error(timeout)
    end,
    ?assertEqual({ok, float(?N * (?N + 1) div 2)}, erlcuda:launch_sync(reduce, [A])),
    %% a small operand beside a large one, and a traced job (its result through the pipe)
    ?assertEqual({ok, vec(2, 2)}, erlcuda:launch_sync(vector_add, [vec(2, 1), vec(2, 1)],
                                                      [{format, binary}])),
    {ok, Want, #{}} = erlcuda:launch_sync(vector_add, [A, B], [{format, binary},
                                                                {trace, true}]),
    [Folder] = folders(),
    %% operands are the callers' data: the folder is its user's alone
    {ok, #file_info{mode = Mode}} = file:read_file_info(Folder),
    ?assertEqual(8#700, Mode band 8#777),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:no_message().

%% While the device is busy the operands wait in the two slots their job took, beside the
%% slot its result goes to; once it is answered the slots are free for the next job, and
%% once idle, nothing is left.
operands_wait_in_files_until_mapped() ->
    erlcuda_test_util:stall(0, 600),
    {ok, Id} = erlcuda:launch(vector_add, [vec(?N, 1), vec(?N, 1)], [{format, binary}]),
    Taken = claimed_files(),
    ?assertMatch([_, _, _], Taken),
    ?assertEqual(Taken, [F || F <- Taken, filelib:is_regular(F)]),
    receive {erlcuda, Id, R} -> ?assertEqual({ok, vec(?N, 2)}, R) after 10000 -> error(timeout)
    end,
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual([], job_files()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

%% Jobs one after another take the same slots (the worker writes their results into the
%% same result slot): no new file for a job of a size seen before.
slots_are_written_again() ->
    N = 2 * erlcuda_shm:part_bytes(0) div 4 + 1000,  % three parts
    A = vec(N, 1), B = vec(N, 2),
    ?assertEqual({ok, vec(N, 3)}, erlcuda:launch_sync(vector_add, [A, B], [{format, binary}])),
    After1 = lists:sort(files()),
    #{made := Made} = erlcuda_shm_slots:stats(),
    Parts = [P || {_, #{parts := Ps}, _} <- ets:tab2list(erlcuda_shm_free), P <- Ps],
    Asked = asked_of(Parts, fun() ->
        [?assertEqual({ok, vec(N, K + 2)},
                      erlcuda:launch_sync(vector_add, [A, vec(N, K + 1)], [{format, binary}]))
         || K <- lists:seq(1, 5)]
    end),
    %% the operands' six parts written each time; the result's pages, allocated by the
    %% first job, not asked for again
    ?assertEqual(#{write => 30, read => 5}, Asked),
    ?assertMatch(#{made := Made, claimed := 0, free := 3}, erlcuda_shm_slots:stats()),
    ?assertEqual(After1, lists:sort(files())),
    ?assertEqual([], job_files()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

%% A `launch_sync' result in a result slot is read and sent by the slot's part process (an
%% alias gets one reply: nothing to keep in order), where a `launch''s goes through a
%% deliverer, which the port owner spawns, so that a later reply to that pid waits for it.
results_sent_by_their_part() ->
    N = 3 * erlcuda_shm:part_bytes(0) div 8,
    A = vec(N, 1),
    {ok, _} = erlcuda:launch_sync(vector_add, [A, A], [{format, binary}]),
    Owner = whereis(erlcuda_worker),
    Spawned = fun(Run) ->
                      erlang:trace(Owner, true, [procs]),
                      Run(),
                      erlang:trace(Owner, false, [procs]),
                      Ref = erlang:trace_delivered(Owner),
                      receive {trace_delivered, Owner, Ref} -> ok end,
                      spawned(0)
              end,
    Sync = Spawned(fun() ->
                       [?assertEqual({ok, vec(N, 2)},
                                     erlcuda:launch_sync(vector_add, [A, A], [{format, binary}]))
                        || _ <- lists:seq(1, 5)]
                   end),
    Async = Spawned(fun() ->
                        [begin
                             {ok, Id} = erlcuda:launch(vector_add, [A, A], [{format, binary}]),
                             ?assertEqual({ok, vec(N, 2)},
                                          receive {erlcuda, Id, R} -> R after 10000 -> none end)
                         end || _ <- lists:seq(1, 5)]
                    end),
    ?assertEqual({0, 5}, {Sync, Async}),
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

spawned(N) ->
    receive
        {trace, _, spawn, _, _} -> spawned(N + 1);
        {trace, _, _, _} -> spawned(N);
        {trace, _, _, _, _} -> spawned(N)
    after 0 ->
        N
    end.

%% What the part processes `Pids' were asked while `Fun' ran, counted by kind.
asked_of(Pids, Fun) ->
    _ = [erlang:trace(P, true, ['receive']) || P <- Pids],
    Fun(),
    _ = [erlang:trace(P, false, ['receive']) || P <- Pids],
    Ref = erlang:trace_delivered(all),
    receive {trace_delivered, all, Ref} -> ok end,
    asked(#{}).

asked(Counts) ->
    receive
        {trace, _, 'receive', {Request, _, _}} ->
            Kind = case Request of {K, _} -> K; K -> K end,
            asked(maps:update_with(Kind, fun(C) -> C + 1 end, 1, Counts));
        {trace, _, 'receive', _} ->
            asked(Counts)
    after 0 ->
        Counts
    end.

%% Vectors over a part's size travel as several part files, written and read at once: the
%% right result, and every part deleted however the job ends (here: its caller killed
%% while the operands wait).
vectors_in_several_parts() ->
    N = 2 * erlcuda_shm:part_bytes(0) div 4 + 1000,  % three parts each
    A = vec(N, 1), B = vec(N, 2),
    Want = vec(N, 3),
    ?assertEqual({ok, Want}, erlcuda:launch_sync(vector_add, [A, B], [{format, binary}])),
    {ok, Sum} = erlcuda:launch_sync(reduce, [A]),
    ?assert(abs(Sum / (N * (N + 1) div 2) - 1) < 1.0e-6),  % an f32 sum of large values
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:stall(0, 600),
    Self = self(),
    Caller = spawn(fun() ->
                           {ok, Id} = erlcuda:launch(vector_add, [A, B]),
                           Self ! {launched, Id},
                           timer:sleep(infinity)
                   end),
    receive {launched, _} -> ok after 5000 -> error(not_launched) end,
    Taken = claimed_files(),
    ?assertEqual(7, length(Taken)),  % two slots of three parts, and the result slot's one
    ?assertEqual(Taken, [F || F <- Taken, filelib:is_regular(F)]),
    exit(Caller, kill),
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:no_message().

%% Parts of whole MiB, up to 8 of them (python/erlcuda/shm.py cuts results the same way).
part_bytes_test() ->
    MiB = 1 bsl 20,
    ?assertEqual([MiB, MiB, MiB, MiB, 2 * MiB, 8 * MiB, 50 * MiB],
                 [erlcuda_shm:part_bytes(N) || N <- [0, 1, MiB, 8 * MiB, 8 * MiB + 1,
                                                     64 * MiB, 400 * MiB]]).

file_result_test() ->
    File = fun(Payload) -> erlcuda_protocol:file_result({wire, ?WIRE_TAG_FILE, Payload}) end,
    ?assertEqual({file, 100, 8388608}, File(<<100:64, 8388608:64>>)),
    ?assertEqual({file, 4096 bsl 16, 4096}, File(<<(4096 bsl 16):64, 4096:64>>)),
    %% a result of 4 GiB or more names a part size over 32 bits
    ?assertEqual({file, 1 bsl 32, 1 bsl 32}, File(<<(1 bsl 32):64, (1 bsl 32):64>>)),
    ?assertEqual(no, File(<<100:64, 100:64>>)),
    ?assertEqual(no, File(<<(4096 bsl 16 + 1):64, 4096:64>>)),
    ?assertEqual(no, File(<<100:64, 4096:32>>)),
    ?assertMatch({erlcuda, 1, {error, {internal, _}}},
                 erlcuda_protocol:message(1, {wire, ?WIRE_TAG_FILE, <<100:64, 100:64>>},
                                          binary, false)).

killed_worker_leaves_no_file() ->
    #{worker_os_pid := Old} = erlcuda:info(),
    [Before] = folders(),
    erlcuda_test_util:stall(0, 3000),
    Ids = [element(2, {ok, _} = erlcuda:launch(vector_add, [vec(?N, 1), vec(?N, 1)]))
           || _ <- lists:seq(1, 5)],
    ?assertEqual(15, length(claimed_files())),  % each job's two operand slots and result slot
    os:cmd("kill -9 " ++ integer_to_list(Old)),
    [receive {erlcuda, Id, R} -> ?assertMatch({error, {worker_down, _}}, R)
     after 10000 -> error({no_reply, Id}) end || Id <- Ids],
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    erlcuda_test_util:wait_restarted(Old, 100),
    %% the dead worker's folder is gone; the new worker has a new, empty one
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> [F || F <- folders(), F =:= Before] =:= [] end, 50)),
    ?assertMatch([_], folders()),
    ?assertEqual([], files()),
    ?assertEqual({ok, vec(?N, 2)}, erlcuda:launch_sync(vector_add, [vec(?N, 1), vec(?N, 1)],
                                                       [{format, binary}])),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

%% A worker killed once it answered two results in result slots, before the second was
%% read: the first one's read is held (its parts suspended), so the second waits behind it
%% in the caller's deliverer until the port owner has killed the folder's keeper. Each job
%% still gets its result, read from the file its slot's part holds open, and nothing is
%% left.
killed_worker_answered_results_delivered() ->
    #{worker_os_pid := Old} = erlcuda:info(),
    A = vec(?N, 1),
    erlcuda_test_util:stall(0, 1000),
    {ok, First} = erlcuda:launch(vector_add, [A, A], [{format, binary}]),
    Held = my_parts(),
    ?assertMatch([_, _, _], Held),
    [erlang:suspend_process(P) || P <- Held],
    {ok, Second} = erlcuda:launch(vector_add, [A, A], [{format, binary}]),
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    ok = erlcuda_test_util:wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100),
    [SecondPart] = my_parts() -- Held,  % its result slot's
    erlcuda_test_util:kill9(Old),
    Taken = fun() -> erlcuda_test_util:keeper_end_taken(SecondPart) end,
    ok = erlcuda_test_util:wait_until(Taken, 100),
    [erlang:resume_process(P) || P <- Held],
    Got = [receive {erlcuda, Id, R} -> R after 10000 -> {no_reply, Id} end
           || Id <- [First, Second]],
    erlcuda_test_util:wait_restarted(Old, 100),
    ?assertEqual([{ok, vec(?N, 2)}, {ok, vec(?N, 2)}], Got),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    erlcuda_test_util:no_message().

%% The part processes of the slots the calling process's jobs hold.
my_parts() ->
    Self = self(),
    [P || {_, Claimer, #{parts := Parts}} <- ets:tab2list(erlcuda_shm_claimed),
          Claimer =:= Self, P <- Parts].

%% A caller that dies with its job in flight: its slots go with the sweep of dead callers,
%% its result slot with them (the result the worker writes there is nobody's).
killed_caller_leaves_no_file() ->
    erlcuda_test_util:stall(0, 800),
    Self = self(),
    Caller = spawn(fun() ->
                           {ok, _} = erlcuda:launch(vector_add, [vec(?N, 1), vec(?N, 1)]),
                           Self ! launched,
                           timer:sleep(infinity)
                   end),
    receive launched -> ok after 5000 -> error(not_launched) end,
    Taken = claimed_files(),
    ?assertEqual(3, length(Taken)),
    exit(Caller, kill),
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    %% its slots were deleted (not given back: the worker may still have been reading them)
    ?assertEqual(ok, erlcuda_test_util:wait_until(
                       fun() -> [F || F <- Taken, filelib:is_regular(F)] =:= []
                                    andalso erlcuda_jobs:size() =:= 0 end, 50)),
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    %% and the job that ran after the sweep left its result nowhere
    timer:sleep(300),
    ?assertEqual([], job_files()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

%% launch_sync that gives up: its job still runs, its result slot already deleted.
timed_out_caller_leaves_no_file() ->
    erlcuda_test_util:stall(0, 500),
    ?assertEqual({error, timeout},
                 erlcuda:launch_sync(vector_add, [vec(?N, 1), vec(?N, 1)], [{timeout, 100}])),
    receive {stalled, _} -> ok after 5000 -> error(no_stall) end,
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:no_message().

%% A launch_sync that gives up deletes its job's slots at once, operands' and result's, while
%% the worker still holds the job (stopped here: the job is counted in flight until it
%% answers). The worker's reply that the result is in its slot, passed on as the port owner
%% does, is dropped unread: no reply, no internal error, counted as dropped; and the
%% worker's own late reply, once it runs again, is taken by nobody.
timed_out_caller_lets_slots_go_at_once() ->
    #{worker_os_pid := Os} = erlcuda:info(),
    #{dropped := Dropped, error := Errors, ok := Oks} = erlcuda_jobs:counters(),
    erlcuda_test_util:signal(Os, "STOP"),
    try
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(vector_add, [vec(?N, 1), vec(?N, 1)],
                                         [{format, binary}, {timeout, 20}])),
        %% the operands' slots are gone at once; the result's stays for the reply
        ?assertMatch(#{claimed := 1}, erlcuda_shm_slots:stats()),
        %% each slot's part deletes its files as it ends
        ?assertEqual(ok, erlcuda_test_util:wait_until(
                           fun() -> length(files() -- free_files()) =:= 1 end, 50)),
        ?assertEqual(1, erlcuda_status:in_flight())
    after
        erlcuda_test_util:signal(Os, "CONT")
    end,
    %% the worker's own late reply (its operands gone before it mapped them): dropped
    %% unanswered, counted as dropped, the result slot gone with it
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100)),
    ?assertMatch(#{dropped := D, error := Errors, ok := Oks} when D =:= Dropped + 1,
                 erlcuda_jobs:counters()),
    ?assertEqual(0, erlcuda_status:in_flight()),
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual({ok, vec(?N, 2)}, erlcuda:launch_sync(vector_add, [vec(?N, 1), vec(?N, 1)],
                                                       [{format, binary}])),
    ?assertEqual(0, erlcuda_status:in_flight()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:no_message().

%% The files of the free slots.
free_files() ->
    [Folder] = folders(),
    [filename:join(Folder, binary_to_list(Name) ++ "." ++ integer_to_list(K))
     || {_, #{name := Name, parts := Parts}, _} <- ets:tab2list(erlcuda_shm_free),
        K <- lists:seq(0, length(Parts) - 1)].

%% A result read from a file takes longer to deliver than the small ones launched after it
%% by the same caller to the same device: they still come after it.
replies_keep_their_order() ->
    Big = vec(1000000, 1), Small = vec(2, 1),
    [begin
         {ok, A} = erlcuda:launch(vector_add, [Big, Big], [{format, binary}]),
         {ok, B} = erlcuda:launch(vector_add, [Small, Small], [{format, binary}]),
         {ok, C} = erlcuda:launch(reduce, [Small]),
         %% the next reply, whichever it is: in arrival order
         Got = [receive {erlcuda, Id, R} -> {Id, element(1, R)} after 10000 -> timeout end
                || _ <- [1, 2, 3]],
         ?assertEqual([{A, ok}, {B, ok}, {C, ok}], Got)
     end || _ <- lists:seq(1, 20)],
    erlcuda_test_util:no_message(),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)).

%% Shared memory gone (as when it is full): the operands' files cannot be written, nor the
%% result's; the job still gets its right result, through the pipe, and nothing is left.
without_room_the_pipe_carries_it() ->
    [Folder] = folders(),
    ok = file:del_dir_r(Folder),
    ?assertEqual({ok, vec(?N, 3)}, erlcuda:launch_sync(vector_add, [vec(?N, 1), vec(?N, 2)],
                                                       [{format, binary}])),
    ?assertEqual({ok, float(?N * (?N + 1) div 2)}, erlcuda:launch_sync(reduce, [vec(?N, 1)])),
    ?assertEqual([], folders()),
    erlcuda_test_util:no_message().

%% Whatever stands at a new slot's path before it is made (a symlink, a FIFO, a directory)
%% is never written through nor waited on: the operands go through the pipe and the job
%% gets its result, well within its timeout.
planted_operand_files_are_never_followed() ->
    A = vec(?N, 1), B = vec(?N, 2),
    [Folder] = folders(),
    Target = filename:join(base(), "target"),
    ok = file:write_file(Target, <<"keep">>),
    [begin
         Path = filename:join(Folder, next_slot() ++ ".0"),
         plant(Kind, Path, Target),
         Got = unblocked(fun() -> erlcuda:launch_sync(vector_add, [A, B],
                                                      [{format, binary}, {timeout, 3000}])
                         end, "timeout 5 cat " ++ Path ++ " >/dev/null"),
         ?assertEqual({Kind, {ok, vec(?N, 3)}}, {Kind, Got}),
         ?assertEqual({Kind, {ok, <<"keep">>}}, {Kind, file:read_file(Target)}),
         _ = file:del_dir(Path)
     end || Kind <- [symlink, fifo, directory]],
    ok = file:delete(Target),
    ?assertEqual(0, erlcuda_jobs:size()),
    ?assertEqual(ok, erlcuda_test_util:wait_until(fun() -> files() =:= [] end, 50)),
    erlcuda_test_util:no_message().

%% The name of the slot the next large operand takes: a new one, once no slot is free.
next_slot() ->
    ok = erlcuda_test_util:wait_until(
           fun() -> maps:get(free, erlcuda_shm_slots:stats()) =:= 0 end, 50),
    #{made := Made} = erlcuda_shm_slots:stats(),
    "s" ++ integer_to_list(Made + 1).

plant(symlink, Path, Target) -> ok = file:make_symlink(Target, Path);
plant(fifo, Path, _) -> "" = os:cmd("mkfifo " ++ Path);
plant(directory, Path, _) -> ok = file:make_dir(Path).

%% Fun() run in a process of its own: its value, or `hung' when it has not returned in
%% 10 s; then Release (a shell command) unblocks it, so nothing stays blocked on a FIFO.
unblocked(Fun, Release) ->
    Self = self(),
    Pid = spawn(fun() -> Self ! {self(), Fun()} end),
    receive {Pid, Got} -> Got
    after 10000 -> _ = os:cmd(Release), hung
    end.

stop_leaves_no_folder() ->
    #{worker_os_pid := Old} = erlcuda:info(),
    os:cmd("kill -9 " ++ integer_to_list(Old)),  % a new worker, with a new folder
    erlcuda_test_util:wait_restarted(Old, 100),
    ?assertMatch([_], folders()),
    ok = application:stop(erlcuda),
    ?assertEqual([], folders()).

%% A worker that cannot set its folder up (a full shared-memory dir, as the test worker makes
%% it with ERLCUDA_TEST_SHM_FULL: no room for the folder's lock) says so in its hello: the
%% folder goes, info shows no threshold, large operands and results take the pipe, and each
%% worker's reason is logged once, however many jobs follow.
full_shm_dir_test_() ->
    {setup,
     fun() -> os:putenv("ERLCUDA_TEST_SHM_FULL", "1") end,
     fun(_) -> os:unsetenv("ERLCUDA_TEST_SHM_FULL"), file:del_dir_r(base()) end,
     with_app([{timeout, 60, fun without_a_folder_the_pipe_carries_it/0}])}.

without_a_folder_the_pipe_carries_it() ->
    N = 100000,  % 400 KB an operand, over the 4 KiB threshold
    A = vec(N, 1), B = vec(N, 2),
    Sum = fun() -> erlcuda:launch_sync(vector_add, [A, B], [{format, binary}]) end,
    ?assertMatch(#{shm_threshold := none, shm_unavailable := <<_/binary>>}, erlcuda:info()),
    ?assertEqual([], folders()),
    ?assertEqual({ok, vec(N, 3)}, Sum()),
    ok = logger:add_handler(?MODULE, erlcuda_test_util,
                            #{config => #{pid => self()}, level => all}),
    try
        %% a new worker: its folder goes at its hello too
        #{worker_os_pid := Old} = erlcuda:info(),
        os:cmd("kill -9 " ++ integer_to_list(Old)),
        erlcuda_test_util:wait_restarted(Old, 100),
        [?assertEqual({ok, vec(N, 3)}, Sum()) || _ <- lists:seq(1, 3)],
        {ok, Id} = erlcuda:launch(vector_add, [A, B], [{format, binary}]),
        receive {erlcuda, Id, R} -> ?assertEqual({ok, vec(N, 3)}, R)
        after 10000 -> error(timeout)
        end,
        ?assertMatch(#{shm_threshold := none}, erlcuda:info()),
        ?assertEqual([], folders())
    after
        ok = logger:remove_handler(?MODULE)
    end,
    ?assertMatch([_], [E || E <- logged(), string:find(E, "no shared memory") =/= nomatch]).

%% The events logged so far, formatted.
logged() ->
    [iolist_to_binary(case Msg of
                          {string, S} -> S;
                          {F, Args} when is_list(F) -> io_lib:format(F, Args);
                          {report, R} -> io_lib:format("~p", [R])
                      end) || {logged, #{msg := Msg}} <- erlcuda_test_util:flush()].

%% A node that dies at once (halt/0: no application stop runs) leaves no folder: the
%% worker dies with it and the worker's reaper removes the folder. Folders that no worker
%% holds any more are removed by the next worker's start.
node_halt_test_() ->
    {timeout, 120, fun node_halt_leaves_no_folder/0}.

node_halt_leaves_no_folder() ->
    Base = base() ++ "-peer",
    _ = file:del_dir_r(Base),
    ok = file:make_dir(Base),
    Stale = filename:join(Base, "erlcuda-4194303-1"),
    ok = file:make_dir(Stale),
    ok = file:write_file(filename:join(Stale, "i1-1"), <<0:32>>),
    %% older than a minute: a younger folder may be one whose worker is still starting
    ok = file:change_time(Stale, {{2026, 1, 1}, {0, 0, 0}}),
    {ok, Peer, _} = peer:start(#{connection => standard_io,
                                 args => lists:append([["-pa", P] || P <- code:get_path(),
                                                                     P =/= "."])}),
    try
        ok = peer:call(Peer, application, load, [erlcuda]),
        [ok = peer:call(Peer, application, set_env, [erlcuda, K, V])
         || {K, V} <- [{backend, cpu}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {shm_dir, Base},
                       {shm_threshold, 4096}]],
        {ok, _} = peer:call(Peer, application, ensure_all_started, [erlcuda], 60000),
        %% the stale folder went at start; the peer's worker has its own
        ?assertEqual(false, filelib:is_dir(Stale)),
        [Folder] = filelib:wildcard(filename:join(Base, "erlcuda-*")),
        {ok, _} = peer:call(Peer, erlcuda, launch_sync, [vector_add, [vec(?N, 1),
                                                                      vec(?N, 1)]]),
        %% operands waiting in the folder when the node goes
        ok = peer:call(Peer, erlang, apply,
                       [fun() ->
                                spawn(fun() -> erlcuda_worker:call(stall, [0, 5000], 9000) end),
                                timer:sleep(100),
                                [erlcuda:launch(vector_add, [vec(?N, 1), vec(?N, 1)])
                                 || _ <- lists:seq(1, 3)],
                                ok
                        end, []]),
        {ok, Names} = file:list_dir(Folder),
        %% two operand slots and a result slot a job
        ?assertEqual(9, length([N || N <- Names, hd(N) =:= $s])),
        catch peer:call(Peer, erlang, halt, [], 1000),
        ?assertEqual(ok, erlcuda_test_util:wait_until(
                           fun() -> filelib:wildcard(filename:join(Base, "*")) =:= [] end,
                           100))
    after
        catch peer:stop(Peer),
        _ = file:del_dir_r(Base)
    end.

scratch(Name) ->
    Dir = filename:join("/tmp", "erlcuda-" ++ Name ++ "-" ++ os:getpid()),
    _ = file:del_dir_r(Dir),
    ok = filelib:ensure_path(Dir),
    Dir.

%% A part is a new file: what already stands at its path (a symlink, a FIFO, a directory)
%% is refused at once, never written through nor waited on.
stage_writes_only_new_files_test_() ->
    {timeout, 60, fun stage_writes_only_new_files/0}.

stage_writes_only_new_files() ->
    Dir = scratch("stage"),
    Target = filename:join(Dir, "target"),
    try
        ok = file:write_file(Target, <<"keep">>),
        [begin
             Path = filename:join(Dir, atom_to_list(Kind) ++ ".0"),
             plant(Kind, Path, Target),
             Got = unblocked(fun() -> erlcuda_shm:stage([{Path, <<"operand">>}]) end,
                             "timeout 5 cat " ++ Path ++ " >/dev/null"),
             ?assertMatch({Kind, {error, <<"shared memory: writing ", _/binary>>}}, {Kind, Got}),
             ?assertEqual({Kind, {ok, <<"keep">>}}, {Kind, file:read_file(Target)})
         end || Kind <- [symlink, fifo, directory]],
        New = filename:join(Dir, "new.0"),
        ?assertEqual(ok, erlcuda_shm:stage([{New, <<"operand">>}])),
        ?assertEqual({ok, <<"operand">>}, file:read_file(New))
    after
        file:del_dir_r(Dir)
    end.

%%% A hostile worker's file records, through the application: a stand-in worker (see
%%% fake_worker/0) answers reduce([S]) with scenario S's record.

hostile_file_records_test_() ->
    Base = base() ++ "-fake",
    {setup,
     fun() -> _ = file:del_dir_r(Base), ok = file:make_dir(Base) end,
     fun(_) -> file:del_dir_r(Base) end,
     erlcuda_test_util:with_app(?DEFAULTS, [{python, fake_worker()}, {start_timeout, 10000},
                                            {shm_dir, Base}, {shm_threshold, 4}],
                                {timeout, 120, fun() -> hostile_file_records(Base) end})}.

%% Each job is answered once, within its timeout: a result in its result slot as the slot
%% holds it, and with an error when the record is not its slot's (another part size), or
%% comes for a job that gave the worker no slot (a traced one). A record that names more
%% than its job's result (more bytes than its slot, 2^40 bytes in parts of 2^24) is answered
%% with an error at once, with no process spawned to read it, and the worker that sent it is
%% restarted. Nothing is left registered or queued.
hostile_file_records(_) ->
    Owner = whereis(erlcuda_worker),
    Sync = fun(S) -> erlcuda:launch_sync(copy, [[float(S), 0.0]], [{timeout, 3000}]) end,
    ?assertEqual({ok, [1.0, 2.0]}, Sync(1)),
    ?assertMatch({error, {internal, _}}, Sync(2)),
    ?assertMatch({error, {internal, _}, _},
                 erlcuda:launch_sync(copy, [[3.0, 0.0]], [{timeout, 3000}, {trace, true}])),
    lists:foreach(
      fun(S) ->
              #{worker_os_pid := Os} = erlcuda:info(),
              1 = erlang:trace(Owner, true, [procs, set_on_spawn]),
              ?assertMatch({error, {internal, _}}, Sync(S)),
              erlang:trace(Owner, false, [procs, set_on_spawn]),
              Ref = erlang:trace_delivered(all),
              receive {trace_delivered, all, Ref} -> ok end,
              ?assertEqual([], [P || {trace, P, spawn, _, _} <- trace_messages([]),
                                     P =/= Owner]),
              erlcuda_test_util:wait_restarted(Os, 100)
      end, [4, 5]),
    ?assertEqual({ok, [1.0, 2.0]}, Sync(1)),
    %% async: exactly one message each
    Ids = [element(2, {ok, _} = erlcuda:launch(copy, [[float(S), 0.0]])) || S <- [1, 2, 3, 4, 5]],
    ?assertEqual(Ids, [receive {erlcuda, Id, _} -> Id after 10000 -> lost end || Id <- Ids]),
    timer:sleep(300),
    erlcuda_test_util:no_message(),
    ?assertEqual(0, erlcuda_jobs:size()),
    ?assertEqual(0, erlcuda_test_util:in_flight()),
    ?assertMatch(#{claimed := 0}, erlcuda_shm_slots:stats()),
    ?assertEqual(Owner, whereis(erlcuda_worker)).

trace_messages(Acc) ->
    receive
        {trace, _, _, _} = T -> trace_messages([T | Acc]);
        {trace, _, _, _, _} = T -> trace_messages([T | Acc])
    after 0 ->
        lists:reverse(Acc)
    end.

%% A stand-in worker: control calls are answered with a valid hello map; copy([S, _]) (its
%% operand in a slot: the threshold is 4 bytes) with a file record for the job's result
%% slot, having written the two f32 1.0, 2.0 at its start:
%%   1 the record saying 8 bytes in the slot's parts      2 in parts of twice the slot's
%%   3 (a traced job, which has no slot) 8 bytes in parts of a MiB
%%   4 the slot's part size and 8 bytes more               5 2^40 bytes in parts of 2^24
fake_worker() ->
    erlcuda_test_util:fake_worker(
      "fake_shm_worker", 1,
      ["DIR = sys.argv[sys.argv.index('--shm-dir') + 1]\n"
       "MIB = 1 << 20\n"], [
"def file_record(j, nbytes, part):\n"
"    payload = struct.pack('>QQ', nbytes, part)\n"
"    send(b'R' + struct.pack('>IQBI', 1, j, ord('f'), len(payload)) + payload)\n"
"def scenario(arg):\n"
"    with open(os.path.join(DIR, arg.name + '.0'), 'rb') as f:\n"
"        return int(struct.unpack('<f', f.read(4))[0])\n"
"def launch(m):\n"
"    s, slot = scenario(m.args[0]), m.result_file\n"
"    if slot is not None:\n"
"        with open(os.path.join(DIR, slot.name + '.0'), 'r+b') as f:\n"
"            f.write(struct.pack('<2f', 1.0, 2.0))\n"
"    part = slot.part_bytes if slot is not None else MIB\n"
"    if s == 1: file_record(m.job_id, 8, part)\n"
"    elif s == 2: file_record(m.job_id, 8, 2 * part)\n"
"    elif s == 3: file_record(m.job_id, 8, MIB)\n"
"    elif s == 4: file_record(m.job_id, part + 8, part)\n"
"    elif s == 5: file_record(m.job_id, 1 << 40, 1 << 24)\n"]).

%% The plan of a launch's operand files, without the application.
shm_plan_keeps_the_type_test() ->
    Folder = #{dir => "/nowhere", threshold => 16},
    {Args, Plan} = erlcuda_shm:plan(Folder, 5, [{vector, f64, binary:copy(<<0>>, 32)},
                                                {handle, 1}, <<0:32>>]),
    ?assertMatch([{file, f64, <<"i5-1">>, 32, _}, {handle, 1}, <<0:32>>], Args),
    ?assertEqual(1, length(Plan)).
