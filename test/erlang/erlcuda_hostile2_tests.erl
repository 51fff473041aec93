%% Hostile tests of protocol 3 (binary launch and results frames) and of the per-port writer
%% (erlcuda_writer). bug_* tests fail today because of the bug they name; holds_* tests check
%% promises that hold. CPU backend, the worker's test double (test/worker).
-module(erlcuda_hostile2_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).

%% An atom no module knows: written here only as a string, never as an atom literal.
-define(NEVER_ATOM, "erlcuda_hostile2_never_an_atom").

%% These tests load the pipe and its writer with large operands: shared memory, which would
%% take those off the pipe, is off.
with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, [{shm_dir, none} | Env], Test).

%%% ---------------------------------------------------------------------------------------
%%% The writer
%%% ---------------------------------------------------------------------------------------

%% The port owner ignores its writer's exit when the reason is `killed'
%% (erlcuda_worker.erl:110-111, `when Why =/= killed'), so a writer killed by anyone but the
%% owner (exit(W, kill), a max_heap_size kill, an operator in a remote shell) stays in the
%% status row as the writer. The next launch that finds the port busy bumps the dead writer's
%% pending counter (erlcuda_writer:hand_over/4), gets `false' and withdraws; the counter is
%% never taken back, so every later launch, busy port or not, is handed to the dead writer
%% and answered {worker_down, port_closed} - for good: the worker never died, nothing is
%% registered, the watchdog has nothing to see, nothing restarts.
bug_writer_killed_is_a_permanent_outage_test_() ->
    with_app([], {timeout, 30, fun() ->
        #{worker_os_pid := Os0} = erlcuda:info(),
        #{writer := W} = erlcuda_status:status(),
        exit(W, kill),
        %% (fixed: the writer's death takes its worker down; a new one starts)
        erlcuda_test_util:wait_restarted(Os0, 100),
        #{worker_os_pid := Os} = erlcuda:info(),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]])),
        %% a busy port (the worker stops reading for a moment), as under any load
        Mb = binary:copy(<<1.0:32/float-little>>, 1 bsl 18),
        signal(Os, "STOP"),
        Launched = [erlcuda:launch(reduce, [Mb]) || _ <- lists:seq(1, 5)],
        signal(Os, "CONT"),
        _ = [receive {erlcuda, Id, _} -> ok after 5000 -> ok end || {ok, Id} <- Launched],
        timer:sleep(500),
        %% the worker is healthy and idle, yet:
        Later = [erlcuda:launch_sync(reduce, [[2.0]], [{timeout, 2000}]) || _ <- lists:seq(1, 3)],
        %% (fixed: a writer's exit of any kind takes its worker down and a new one starts)
        ?assertMatch(#{worker_status := up}, erlcuda:info()),
        ?assertEqual(lists:duplicate(3, {ok, 2.0}), Later)
    end}).

%% The writer gathers whatever is queued while the batch holds under 16 MiB
%% (erlcuda_writer.erl:156) and then also takes the next frame whatever its size, so a batch
%% frame can exceed max_frame (4 GiB - 1) even though every launch in it passed
%% encode_launch's check. erts then writes the {packet, 4} length modulo 2^32 (it does not
%% refuse it): the worker reads a short frame and then the launches' bytes - caller data - as
%% frame headers and frames (the defect erlcuda_defects_tests:frame_over_4gib_test_ fixed
%% for single launches: lost jobs, and a crafted operand can forge another caller's result).
%% Reproduced on a port to a script that reports the first frame it reads; the 4 GiB operand
%% is one 16 MiB binary referenced 256 times, so this costs 16 MiB of memory.
bug_batch_frame_over_frame_limit_test_() ->
    {timeout, 60, fun() ->
        Max = erlcuda_contract:max_frame(),
        {ok, Small} = erlcuda_protocol:encode_launch(1, 0, reduce, [binary:copy(<<0>>, 600)],
                                                     #{trace => false, result_file => false}),
        %% a launch of reduce with one vector of BigN bytes, as encode_launch/5 writes it
        BigN = 4294966764,
        ?assert(BigN + 512 + 16 =< Max),           % encode_launch's own check passes
        {ok, [_Length, Head | _]} =
            erlcuda_protocol:encode_launch(2, 0, reduce, [<<>>],
                                           #{trace => false, result_file => false}),
        Chunk = binary:copy(<<0>>, 1 bsl 24),
        Full = BigN div (1 bsl 24),
        Body = [Head, <<86, 0, BigN:64>>, lists:duplicate(Full, Chunk),
                binary:part(Chunk, 0, BigN - Full * (1 bsl 24))],
        ?assert(iolist_size(Body) =< Max),
        Big = [<<(iolist_size(Body)):32>> | Body],
        ?assert(iolist_size(erlcuda_protocol:encode_batch([Small, Big])) > Max),
        %% the port closes with epipe once the script exits: trap that
        Trap = process_flag(trap_exit, true),
        Port = open_port({spawn_executable, erlcuda_paths:python(default)},
                         [{args, [header_reporter()]}, stream, binary, exit_status,
                          use_stdio]),
        {W, C} = erlcuda_writer:start_link(Port),
        unlink(W),
        try
            %% both frames wait in the writer's mailbox, as under load on a busy port
            erlang:suspend_process(W),
            ok = erlcuda_writer:hand_over(W, C, Small, iolist_size(Small), infinity),
            spawn(fun() -> erlcuda_writer:hand_over(W, C, Big, iolist_size(Big), infinity) end),
            ok = wait_until(fun() ->
                                    element(2, process_info(W, message_queue_len)) =:= 2
                            end, 50),
            erlang:resume_process(W),
            First = receive {Port, {data, <<5:32, Len:32, Whole:8>>}} -> {Len, Whole}
                    after 30000 -> no_report end,
            %% the first frame the worker reads must be whole: a launch, or a batch whose
            %% launches end exactly at the frame's end
            ?assertMatch({FirstLen, 1} when FirstLen =< Max, First)
        after
            exit(W, kill),
            catch port_close(Port),
            receive {'EXIT', Port, _} -> ok after 1000 -> ok end,
            process_flag(trap_exit, Trap),
            flush()
        end
    end}.

%% Past 64 MiB waiting in the writer a caller waits for its frame to be written
%% (erlcuda_writer:hand_over/4, a receive with no timeout): launch_sync's {timeout, Ms}
%% does not bound that wait (submit runs before await/3 starts its timer, erlcuda.erl:88),
%% so launch_sync(..., [{timeout, 300}]) blocks for as long as the port stays busy - here
%% 2.5 s, with a worker that stops reading until the watchdog (30 s by default) kills it.
bug_launch_sync_timeout_not_kept_behind_the_writer_test_() ->
    with_app([], {timeout, 40, fun() ->
        #{worker_os_pid := Os} = erlcuda:info(),
        Self = self(),
        Mb = binary:copy(<<1.0:32/float-little>>, 1 bsl 18),
        signal(Os, "STOP"),
        Fillers = [spawn(fun() ->
                                 R = erlcuda:launch(reduce, [Mb]),
                                 Self ! {filled, self(), R},
                                 receive {erlcuda, _, _} -> ok after 20000 -> ok end
                         end) || _ <- lists:seq(1, 80)],
        timer:sleep(500),
        T0 = erlang:monotonic_time(millisecond),
        spawn(fun() ->
                      Sync = erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 300}]),
                      Self ! {sync, Sync, erlang:monotonic_time(millisecond) - T0}
              end),
        Got = receive {sync, SyncR, SyncMs} -> {SyncR, SyncMs}
              after 2500 -> still_waiting_after_2500_ms end,
        signal(Os, "CONT"),
        _ = [receive {filled, F, _} -> ok after 10000 -> ok end || F <- Fillers],
        receive {sync, _, _} -> ok after 10000 -> ok end,
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100),
        %% answered while the worker was still stopped, not once it went on
        ?assertMatch({{error, timeout}, _}, Got)
    end}).

%% A worker killed while frames sit in the writer's mailbox and callers of large jobs are
%% blocked waiting for the writer's ack: nobody hangs, every job gets exactly one reply
%% ({worker_down, _}), the job table and the queue counters come back to 0, and the new
%% worker's writer starts with nothing pending.
holds_worker_death_with_a_writer_backlog_test_() ->
    with_app([], {timeout, 40, fun() ->
        #{worker_os_pid := Os} = erlcuda:info(),
        #{writer := W0} = erlcuda_status:status(),
        Self = self(),
        Mb = binary:copy(<<1.0:32/float-little>>, 1 bsl 18),
        signal(Os, "STOP"),
        Callers = [spawn(fun() -> Self ! {result, self(), one_job(I, Mb)} end)
                   || I <- lists:seq(1, 100)],
        Blocked = fun() -> length([C || C <- Callers,
                                        {current_function, {erlcuda_writer, hand_over, 5}} =:=
                                            process_info(C, current_function)])
                  end,
        ok = wait_until(fun() -> Blocked() > 0 end, 150),
        ?debugFmt("callers blocked on the writer's ack when the worker died: ~b", [Blocked()]),
        kill9(Os),
        Results = [receive {result, C, R} -> R after 15000 -> hung end || C <- Callers],
        ?assertEqual([], [R || R <- Results, not is_worker_down(R)]),
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 andalso in_flight() =:= 0 end, 50),
        erlcuda_test_util:wait_restarted(Os, 100),
        #{writer := W1, writer_counters := C1} = erlcuda_status:status(),
        ?assertNotEqual(W0, W1),
        ?assertEqual(0, erlcuda_writer:pending(C1)),
        ?assertEqual({ok, [3.0]}, erlcuda:launch_sync(vector_add, [[1.0], [2.0]])),
        no_message()
    end}).

%% One caller's jobs to one device are answered in the order launched, when some of its
%% frames go straight to the port and some through the writer (a background load keeps
%% the port busy on and off, and the worker stops reading for a moment in the middle, so
%% that both paths are certainly taken); and each job is answered once.
holds_order_across_direct_and_writer_frames_test_() ->
    with_app([], {timeout, 40, fun() ->
        #{worker_os_pid := Os, writer := #{jobs := Before}} = erlcuda:info(),
        Stop = make_ref(),
        Load = [spawn(fun() -> load(binary:copy(<<1.0:32/float-little>>, 16384), Stop) end)
                || _ <- lists:seq(1, 30)],
        Big = binary:copy(<<1.0:32/float-little>>, 1 bsl 16),
        Launch = fun(I) ->
                         V = case I rem 3 of 0 -> Big; _ -> <<(float(I)):32/float-little>> end,
                         {ok, Id} = erlcuda:launch(reduce, [V], [{device, 1}]),
                         Id
                 end,
        Ids1 = [Launch(I) || I <- lists:seq(1, 200)],
        signal(Os, "STOP"),
        Ids2 = [Launch(I) || I <- lists:seq(201, 400)],
        signal(Os, "CONT"),
        Ids3 = [Launch(I) || I <- lists:seq(401, 600)],
        Ids = Ids1 ++ Ids2 ++ Ids3,
        Got = [receive {erlcuda, Id, _} -> Id after 20000 -> lost end || _ <- Ids],
        [P ! Stop || P <- Load],
        timer:sleep(200),
        no_message(),
        ?assertEqual(Ids, Got),
        #{writer := #{jobs := After}} = erlcuda:info(),
        ?debugFmt("jobs through the writer during the run: ~b", [After - Before]),
        ?assert(After > Before)
    end}).

%% 1000 callers at once, each with launch_sync (list and binary formats) and launch: every
%% one gets its own right answers, nothing is left in flight, no stray message.
holds_a_thousand_callers_test_() ->
    with_app([], {timeout, 60, fun() ->
        Self = self(),
        Pids = [spawn(fun() -> Self ! {done, self(), caller(C)} end) || C <- lists:seq(1, 1000)],
        Bad = [{P, R} || P <- Pids,
                         R <- [receive {done, P, X} -> X after 40000 -> hung end],
                         R =/= ok],
        ?assertEqual([], Bad),
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 andalso in_flight() =:= 0 end, 50),
        #{writer_counters := Counters} = erlcuda_status:status(),
        ?assertEqual(0, erlcuda_writer:pending(Counters))
    end}).

caller(C) ->
    F = float(C),
    V = binary:copy(<<F:32/float-little>>, 256),
    Want = lists:duplicate(256, 2 * F),
    R1 = erlcuda:launch_sync(vector_add, [V, V], [{timeout, 30000}, {device, any}]),
    R2 = erlcuda:launch_sync(vector_add, [V, V], [{timeout, 30000}, {format, binary}]),
    {ok, Id} = erlcuda:launch(reduce, [V], [{device, C rem 2}]),
    R3 = receive {erlcuda, Id, X} -> X after 30000 -> lost end,
    Extra = receive Any -> {stray, Any} after 0 -> none end,
    case {R1, R2, R3, Extra} of
        {{ok, Want}, {ok, Bin}, {ok, S}, none} when S == 256 * F ->
            case [Y || <<Y:32/float-little>> <= Bin] =:= Want of
                true -> ok;
                false -> {wrong_binary, C}
            end;
        Other ->
            {C, Other}
    end.

%%% ---------------------------------------------------------------------------------------
%%% launch_sync's {f32, Bin} path, traced jobs, telemetry
%%% ---------------------------------------------------------------------------------------

%% A launch_sync that times out while its vector result is on its way leaves nothing in the
%% mailbox, later either; non-finite vectors and scalars are {error, {non_finite, _}} in list
%% format and raw in binary format; the queue counters come back to 0.
holds_launch_sync_f32_timeout_and_non_finite_test_() ->
    with_app([], {timeout, 30, fun() ->
        erlcuda_test_util:stall(0, 800),
        V = binary:copy(<<1.5:32/float-little>>, 1000),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(vector_add, [V, V], [{timeout, 100}])),
        receive {stalled, {ok, _}} -> ok after 5000 -> error(no_stall) end,
        timer:sleep(300),
        no_message(),
        Big = [3.0e38, 3.0e38],
        ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(vector_add, [Big, Big])),
        ?assertMatch({error, {non_finite, _}}, erlcuda:launch_sync(reduce, [Big])),
        {ok, Raw} = erlcuda:launch_sync(vector_add, [Big, Big], [{format, binary}]),
        ?assertEqual(<<0, 0, 128, 127, 0, 0, 128, 127>>, Raw),   % +inf twice
        {ok, Id} = erlcuda:launch(vector_add, [Big, Big]),
        ?assertMatch({error, {non_finite, _}}, receive {erlcuda, Id, R} -> R after 5000 -> lost end),
        ok = wait_until(fun() -> in_flight() =:= 0 end, 30),
        no_message()
    end}).

%% The telemetry contract (README, Telemetry): a job answered {ok, _} emits
%% [erlcuda, job, stop]. A launch_sync caller of a vector in list format is sent
%% {f32, Bin} (erlcuda_protocol.erl:128-129), erlcuda_jobs:complete/2 passes that as the result
%% to erlcuda_telemetry:job_stop/5, whose catch-all clause (erlcuda_telemetry.erl:52-54)
%% emits [erlcuda, job, exception] with `reason => {f32, Bin}' for every successful one
%% (the whole result binary as the "reason").
bug_sync_vector_success_emits_exception_test_() ->
    with_app([{telemetry_module, erlcuda_telemetry_standin}], fun() ->
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
            flush()
        end
    end).

%% README, Options: with {trace, true} "the reply is {erlcuda, JobId, Result, Stamps};
%% launch_sync answers {ok, R, Stamps} or {error, Why, Stamps}". A traced job answered by
%% the Erlang side (worker death, fail_all; the sweep) gets the untraced 3-tuple
%% (erlcuda_jobs.erl:67: the job entry does not even record that it was traced), so a
%% traced caller that matches the documented shape never sees its reply.
bug_traced_job_failed_by_erlang_loses_its_shape_test_() ->
    with_app([], {timeout, 30, fun() ->
        #{worker_os_pid := Os} = erlcuda:info(),
        erlcuda_test_util:stall(0, 3000),
        {ok, Id} = erlcuda:launch(reduce, [[1.0]], [{trace, true}]),
        kill9(Os),
        Got = receive
                  {erlcuda, Id, R, Stamps} -> {traced, R, Stamps};
                  {erlcuda, Id, R} -> {untraced, R}
              after 5000 -> none
              end,
        receive {stalled, _} -> ok after 5000 -> ok end,
        erlcuda_test_util:wait_restarted(Os, 100),
        ?assertMatch({traced, {error, {worker_down, _}}, _}, Got)
    end}).

%%% ---------------------------------------------------------------------------------------
%%% What the port owner does per result
%%% ---------------------------------------------------------------------------------------

%% A large vector result delivered on device 0 (a {format, binary} result forwarded as a
%% sub-binary by the port owner, or a launch_sync list its caller makes) while a caller
%% loops small jobs on device 1: the big result arrives whole and every small job is
%% answered right. How long the small jobs wait meanwhile is measured by bench/run's hold
%% section, not here: a shared CI machine gives no stable timing.
large_results_are_delivered_beside_small_jobs_test_() ->
    with_app([], {timeout, 60, fun() ->
        Self = self(),
        V = binary:copy(<<1.0:32/float-little>>, 1 bsl 22),
        lists:foreach(
          fun(Launch) ->
                  spawn(fun() -> Self ! {big, Launch(V)} end),
                  small_jobs_until_big(erlang:monotonic_time(millisecond) + 40000)
          end,
          [fun(A) ->
                   {ok, Id} = erlcuda:launch(vector_add, [A, A], [{device, 0}, {format, binary}]),
                   receive {erlcuda, Id, {ok, B}} -> byte_size(B) div 4 after 40000 -> lost end
           end,
           fun(A) ->
                   {ok, L} = erlcuda:launch_sync(vector_add, [A, A], [{device, 0}, {timeout, 40000}]),
                   length(L)
           end])
    end}).

%% Small jobs on device 1, each answered right, until the big result came whole.
small_jobs_until_big(Deadline) ->
    receive
        {big, N} -> ?assertEqual(1 bsl 22, N)
    after 0 ->
        case erlang:monotonic_time(millisecond) > Deadline of
            true -> error(big_job_lost);
            false ->
                ?assertEqual({ok, 1.0},
                             erlcuda:launch_sync(reduce, [[1.0]], [{device, 1}, {timeout, 40000}])),
                small_jobs_until_big(Deadline)
        end
    end.

%% Every {format, binary} vector result is a sub-binary of the whole results frame
%% (erlcuda_protocol.erl:126-127, cut by each_result/2 at :101): a caller that keeps a 128-byte result
%% keeps alive the frame of the lane's whole batch - here 16 MiB of another caller's result.
%% Results kept (a cache, an ETS table, a gen_server's state) pin frames of up to 4 GiB each.
bug_small_binary_result_pins_the_whole_results_frame_test_() ->
    with_app([], {timeout, 30, fun() ->
        Self = self(),
        erlcuda_test_util:stall(0, 400),
        V = binary:copy(<<1.0:32/float-little>>, 1 bsl 22),
        spawn(fun() ->
                      {ok, Id} = erlcuda:launch(vector_add, [V, V], [{format, binary}]),
                      receive {erlcuda, Id, _} -> Self ! big_done after 10000 -> ok end
              end),
        timer:sleep(20),
        S = lists:duplicate(32, 1.0),
        {ok, Small} = erlcuda:launch_sync(vector_add, [S, S], [{format, binary}]),
        receive big_done -> ok after 10000 -> ok end,
        receive {stalled, _} -> ok after 5000 -> ok end,
        erlang:garbage_collect(),
        ?debugFmt("a ~b-byte result keeps ~b bytes alive",
                  [byte_size(Small), binary:referenced_byte_size(Small)]),
        ?assert(binary:referenced_byte_size(Small) < 1 bsl 20)
    end}).

%%% ---------------------------------------------------------------------------------------
%%% A hostile worker's results frames
%%% ---------------------------------------------------------------------------------------
%%
%% The fake worker answers every control call (hello included) with a valid hello map and
%% answers each launch of reduce([S]) with the records of scenario S (see fake_worker/0).

%% Unknown job ids, a record twice (in one frame and in a later one), an error payload
%% naming an atom the node does not know, one that is not ETF, +inf: each real job gets
%% exactly one reply, the port owner survives, no atom is made.
holds_hostile_results_records_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        Owner = whereis(erlcuda_worker),
        Sync = fun(S) -> erlcuda:launch_sync(reduce, [[float(S)]], [{timeout, 3000}]) end,
        ?assertEqual({ok, 42.0}, Sync(1)),
        ?assertEqual({ok, 2.0}, Sync(2)),
        ?assertEqual({ok, 5.0}, Sync(5)),
        ?assertMatch({error, {internal, _}}, Sync(7)),
        ?assertError(badarg, list_to_existing_atom(?NEVER_ATOM)),
        ?assertMatch({error, {internal, _}}, Sync(8)),
        ?assertMatch({error, {non_finite, _}}, Sync(11)),
        %% async: exactly one message each
        Ids = [begin {ok, Id} = erlcuda:launch(reduce, [[float(S)]]), Id end
               || S <- [1, 2, 5, 7, 8, 11]],
        Got = [receive {erlcuda, Id, _} -> Id after 3000 -> lost end || Id <- Ids],
        ?assertEqual(Ids, Got),
        timer:sleep(300),
        no_message(),
        ?assertEqual(0, erlcuda_jobs:size()),
        ?assertEqual(Owner, whereis(erlcuda_worker)),
        ?assertMatch(#{restarts := 0}, erlcuda:info())
    end}).

%% Records that do not fit the job they name: a wrong tag, a scalar of 4 bytes, a vector
%% answering a reduce, a vector of 3 elements answering a vector_add of 4, a buffer the job
%% was not to keep answering a copy that keeps (another caller's). Each such job is
%% answered `{error, {internal, _}}' once (before, a reduce was answered with a list and a
%% vector_add with three elements), and the worker that confused them is restarted.
records_that_do_not_fit_their_job_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 60, fun() ->
        Owner = whereis(erlcuda_worker),
        Jobs = [{reduce, [[3.0]], []}, {reduce, [[9.0]], []}, {reduce, [[12.0]], []},
                {vector_add, [[13.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], []},
                {copy, [[14.0]], [{keep, true}]}],
        lists:foreach(
          fun({Kernel, Args, Opts}) ->
                  #{worker_os_pid := Os} = erlcuda:info(),
                  ?assertMatch({error, {internal, _}},
                               erlcuda:launch_sync(Kernel, Args, [{timeout, 5000} | Opts])),
                  erlcuda_test_util:wait_restarted(Os, 100)
          end, Jobs),
        ?assertEqual(0, erlcuda_buffers:count()),
        {ok, Id} = erlcuda:launch(reduce, [[12.0]]),
        ?assertMatch({error, {internal, _}},
                     receive {erlcuda, Id, R} -> R after 5000 -> no_reply end),
        timer:sleep(300),
        no_message(),
        ?assertEqual(Owner, whereis(erlcuda_worker))
    end}).

%% A record cut short, or one whose Len runs past the frame (0xFFFFFFFF): each_result/2
%% stops with `malformed' and the port owner only logs it (erlcuda_worker.erl:173-178). The
%% job whose header was readable is never answered and stays registered, with its place in
%% the device queue, for as long as the worker keeps talking (the watchdog looks only at
%% silence); an async caller waits for ever.
bug_malformed_record_leaves_its_job_unanswered_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        {ok, Cut} = erlcuda:launch(reduce, [[4.0]]),
        {ok, Huge} = erlcuda:launch(reduce, [[6.0]]),
        Got = [receive {erlcuda, Id, R} -> R after 3000 -> no_reply end || Id <- [Cut, Huge]],
        Left = erlcuda_jobs:size(),
        ?assertEqual({[false, false], 0}, {[R =:= no_reply || R <- Got], Left})
    end}).

%% An error payload is decoded with binary_to_term(_, [safe]) (erlcuda_protocol.erl:154-155, term/1),
%% which inflates compressed ETF (tag 80) to whatever size its header claims: a record of
%% about 256 KiB becomes a 256 MiB term in the port owner and the caller (x1000; a 4 MiB
%% record, 4 GiB; one per job in flight, enough to take the node down). The worker never
%% compresses, and its own ETF decoder bounds the deflate ratio (etf.MAX_DEFLATE_RATIO);
%% the Erlang side does not.
bug_compressed_error_payload_amplifies_test_() ->
    with_app([{python, fake_worker()}, {start_timeout, 10000}], {timeout, 30, fun() ->
        R = erlcuda:launch_sync(reduce, [[10.0]], [{timeout, 10000}]),
        Size = erlang:external_size(R),
        ?debugFmt("reply to a compressed error record inflating to ~b MiB: ~b MiB",
                  [fake_bomb_mib(), Size bsr 20]),
        ?assert(Size < 16 bsl 20)
    end}).

%%% ---------------------------------------------------------------------------------------
%%% Helpers
%%% ---------------------------------------------------------------------------------------

one_job(I, Mb) ->
    case I rem 4 of
        0 ->
            case erlcuda:launch_sync(reduce, [Mb], [{timeout, 20000}]) of
                {error, timeout} -> hung;
                R -> {R, no_extra(none)}
            end;
        _ ->
            case erlcuda:launch(reduce, [Mb]) of
                {ok, Id} ->
                    R = receive {erlcuda, Id, X} -> X after 10000 -> no_reply end,
                    {R, no_extra(Id)};
                {error, _} = E ->
                    {E, no_extra(none)}
            end
    end.

no_extra(none) -> receive Any -> {stray, Any} after 300 -> ok end;
no_extra(Id) -> receive {erlcuda, Id, _} = M -> {extra, M} after 300 -> ok end.

is_worker_down({{error, {worker_down, _}}, ok}) -> true;
is_worker_down(_) -> false.

load(V, Stop) ->
    {ok, Id} = erlcuda:launch(reduce, [V], [{device, 0}]),
    receive
        Stop -> ok
    after 0 ->
        receive {erlcuda, Id, _} -> ok after 10000 -> ok end,
        load(V, Stop)
    end.

signal(OsPid, Sig) ->
    _ = os:cmd("kill -" ++ Sig ++ " " ++ integer_to_list(OsPid)),
    ok.

kill9(OsPid) -> signal(OsPid, "9").

in_flight() -> erlcuda_test_util:in_flight().

wait_until(Cond, N) -> erlcuda_test_util:wait_until(Cond, N).

no_message() -> erlcuda_test_util:no_message().

flush() ->
    receive _ -> flush() after 0 -> ok end.

tmp_dir() ->
    string:trim(os:cmd("mktemp -d")).

%% A script for a {packet, 4} port on stdio: it reads one frame and answers <<Len:32,
%% Whole:8>>, Whole 1 when the body is a launch, or a batch whose launches end exactly at
%% its end; then it exits.
header_reporter() ->
    Script = filename:join(tmp_dir(), "header_reporter.py"),
    ok = file:write_file(Script, <<
"import os, struct, sys\n"
"def read(n):\n"
"    b = bytearray()\n"
"    while len(b) < n:\n"
"        c = os.read(0, min(n - len(b), 1 << 20))\n"
"        if not c:\n"
"            sys.exit(0)\n"
"        b += c\n"
"    return bytes(b)\n"
"(n,) = struct.unpack('>I', read(4))\n"
"whole = 0\n"
"if n <= (1 << 24):\n"
"    body = read(n)\n"
"    if body[:1] == b'J':\n"
"        whole = 1\n"
"    elif body[:1] == b'B' and len(body) >= 5:\n"
"        (count,) = struct.unpack_from('>I', body, 1)\n"
"        pos = 5\n"
"        for _ in range(count):\n"
"            if pos + 4 > len(body):\n"
"                break\n"
"            (k,) = struct.unpack_from('>I', body, pos)\n"
"            pos += 4 + k\n"
"        else:\n"
"            whole = int(pos == len(body))\n"
"else:\n"
"    whole = 2  # a frame over 16 MiB first: not checked here\n"
"out = struct.pack('>IB', n, whole)\n"
"os.write(1, struct.pack('>I', len(out)) + out)\n">>),
    Script.

fake_bomb_mib() -> 256.

%% A stand-in worker: every control call is answered with a valid hello map; a launch of
%% reduce([S]) (alone or in a batch frame) is answered with scenario S's records:
%%   1 its result, 42.0            2 a record for an unknown job id, then its result, 2.0
%%   3 a record with tag 'Z'       4 a record cut short (Len 8, 4 bytes follow)
%%   5 its result 5.0 twice in one frame, and once more in a second frame
%%   6 a record whose Len is 0xFFFFFFFF                      7 an error naming a new atom
%%   8 an error payload that is not ETF                      9 a scalar of 4 bytes
%%  10 an error payload of compressed ETF inflating to 256 MiB      11 a scalar +inf
%%  12 an f32 vector of 4 elements                                 13 one of 3 elements
%%  14 a buffer of id 2^62
fake_worker() ->
    erlcuda_test_util:fake_worker(
      "fake_worker", 2,
      ["NEVER = b'", ?NEVER_ATOM, "'\n"
       "BOMB_MIB = ", integer_to_list(fake_bomb_mib()), "\n"], [
"def results(*records):\n"
"    send(b'R' + struct.pack('>I', len(records)) + b''.join(records))\n"
"def rec(job, tag, payload, n=None):\n"
"    return struct.pack('>QBI', job, tag, len(payload) if n is None else n) + payload\n"
"def f64(x):\n"
"    return struct.pack('<d', x)\n"
"S, E = ord('s'), ord('e')\n"
"def bomb():\n"
"    n = BOMB_MIB << 20\n"
"    term = b'h\\x02w\\x08bad_argsm' + struct.pack('>I', n)\n"
"    z = zlib.compressobj(9)\n"
"    out = z.compress(term)\n"
"    zeros = bytes(1 << 20)\n"
"    for _ in range(BOMB_MIB):\n"
"        out += z.compress(zeros)\n"
"    out += z.flush()\n"
"    return b'\\x83P' + struct.pack('>I', len(term) + n) + out\n"
"def answer(j, s):\n"
"    if s == 1: results(rec(j, S, f64(42.0)))\n"
"    elif s == 2: results(rec(j + (1 << 40), S, f64(1.0)), rec(j, S, f64(2.0)))\n"
"    elif s == 3: results(rec(j, ord('Z'), f64(3.0)))\n"
"    elif s == 4: results(rec(j, S, f64(4.0), 8)[:-4])\n"
"    elif s == 5:\n"
"        results(rec(j, S, f64(5.0)), rec(j, S, f64(5.5)))\n"
"        results(rec(j, S, f64(5.7)))\n"
"    elif s == 6: results(rec(j, S, f64(6.0), 0xFFFFFFFF))\n"
"    elif s == 7: results(rec(j, E, b'\\x83h\\x02w\\x08bad_argsw' + bytes((len(NEVER),)) + NEVER))\n"
"    elif s == 8: results(rec(j, E, b'not an external term'))\n"
"    elif s == 9: results(rec(j, S, b'\\x00\\x00\\x80\\x7f'))\n"
"    elif s == 10: results(rec(j, E, bomb()))\n"
"    elif s == 11: results(rec(j, S, f64(float('inf'))))\n"
"    elif s == 12: results(rec(j, ord('v'), bytes(16)))\n"
"    elif s == 13: results(rec(j, ord('v'), bytes(12)))\n"
"    elif s == 14: results(rec(j, ord('h'), struct.pack('>QBQ', 1 << 62, 0, 1)))\n"
"def launch(m):\n"
"    answer(m.job_id, int(m.args[0][0]) if m.args and len(m.args[0]) else 0)\n"]).
