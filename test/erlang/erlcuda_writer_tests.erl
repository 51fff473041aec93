%% The port writer (erlcuda_writer) and the frames written to the worker's port: a writer
%% killed or its worker dying with a backlog, batch frames within the frame limit, launch_sync's
%% timeout behind a busy writer, the order of jobs across direct and writer frames, a thousand
%% callers at once, the port owner beside a busy port, operand frames over 4 GiB, callers killed
%% while writing, and results no frame can carry. CPU backend, the worker's test double
%% (test/worker).
-module(erlcuda_writer_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, erlcuda_test_util:fault_defaults()).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

%% The tests of the writer load the pipe with large operands: shared memory, which would
%% take those off the pipe, is off for them.
with_app_no_shm(Env, Test) ->
    with_app([{shm_dir, none} | Env], Test).

%% A writer killed by anyone but the port owner (exit(W, kill), a max_heap_size kill, an
%% operator in a remote shell) takes its worker down and a new worker and writer start: a dead
%% writer must never stay in the status row, or every launch that found the port busy would be
%% handed to it and answered {worker_down, port_closed} for good while the worker is healthy.
killed_writer_takes_its_worker_down_test_() ->
    with_app_no_shm([], {timeout, 30, fun() ->
        #{worker_os_pid := Os0} = erlcuda:info(),
        #{writer := W} = erlcuda_status:status(),
        exit(W, kill),
        %% the writer's death takes its worker down; a new one starts
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
        %% the worker is healthy and idle: later launches are answered
        Later = [erlcuda:launch_sync(reduce, [[2.0]], [{timeout, 2000}]) || _ <- lists:seq(1, 3)],
        ?assertMatch(#{worker_status := up}, erlcuda:info()),
        ?assertEqual(lists:duplicate(3, {ok, 2.0}), Later)
    end}).

%% The writer gathers queued frames into one batch frame; a batch must never exceed max_frame
%% (4 GiB - 1) even though every launch in it passed encode_launch's check, or erts writes the
%% {packet, 4} length modulo 2^32: the worker would read a short frame and then the launches'
%% bytes - caller data - as frame headers and frames (lost jobs, and a crafted operand could
%% forge another caller's result; see frame_over_4gib_test_ for single launches).
%% Checked on a port to a script that reports the first frame it reads; the 4 GiB operand
%% is one 16 MiB binary referenced 256 times, so this costs 16 MiB of memory.
batch_frame_stays_within_the_frame_limit_test_() ->
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

%% Past 64 MiB waiting in the writer a caller waits for its frame to be written: launch_sync's
%% {timeout, Ms} bounds that wait too, so launch_sync(..., [{timeout, 300}]) answers
%% {error, timeout} while the port stays busy (a worker that stops reading until the watchdog,
%% 30 s by default, would kill it), and the writer's answer once the frame is written later
%% never reaches that caller's mailbox. A list out of range is refused without that wait.
launch_sync_timeout_holds_behind_the_writer_test_() ->
    with_app_no_shm([], {timeout, 40, fun() ->
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
        Waiter = spawn(fun() ->
                               Sync = erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 300}]),
                               Self ! {sync, Sync, erlang:monotonic_time(millisecond) - T0},
                               %% what reached it after it stopped waiting
                               receive go -> Self ! {left, erlcuda_test_util:flush()} end
                       end),
        Got = receive {sync, SyncR, SyncMs} -> {SyncR, SyncMs}
              after 2500 -> still_waiting_after_2500_ms end,
        %% a list out of range is refused without waiting for the writer, as launch/3 does
        Bad = erlcuda:launch(reduce, [[1.0e39]]),
        ?assertMatch({error, {bad_args, _}}, Bad),
        #{writer_counters := Counters} = erlcuda_status:status(),
        Pending = erlcuda_writer:pending(Counters),
        spawn(fun() -> Self ! {bad, erlcuda:launch_sync(reduce, [[1.0e39]], [{timeout, 3000}])}
              end),
        GotBad = receive {bad, B} -> B after 20000 -> no_answer end,
        %% no frame handed to the writer to wait behind the others (a frame handed over
        %% stays counted until written, and the worker still reads nothing)
        ?assertEqual(Pending, erlcuda_writer:pending(Counters)),
        signal(Os, "CONT"),
        _ = [receive {filled, F, _} -> ok after 10000 -> ok end || F <- Fillers],
        receive {sync, _, _} -> ok after 10000 -> ok end,
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 end, 100),
        %% answered while the worker was still stopped, not once it went on
        ?assertMatch({{error, timeout}, _}, Got),
        ?assertEqual(Bad, GotBad),
        %% its frame written after it gave up: the writer's late answer is dropped
        Waiter ! go,
        ?assertEqual([], receive {left, Left} -> Left after 5000 -> no_answer end)
    end}).

%% A worker killed while frames sit in the writer's mailbox and callers of large jobs are
%% blocked waiting for the writer's ack: nobody hangs, every job gets exactly one reply
%% ({worker_down, _}), the job table and the queue counters come back to 0, and the new
%% worker's writer starts with nothing pending.
worker_death_with_a_writer_backlog_test_() ->
    with_app_no_shm([], {timeout, 40, fun() ->
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
order_across_direct_and_writer_frames_test_() ->
    with_app_no_shm([], {timeout, 40, fun() ->
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

%% The writer's count of frames handed over and not yet written, when it falls idle with a
%% count up: a caller counted its frame and was held up before sending it, or was killed in
%% between. The late frame, once written, leaves the count at zero, never below it (below,
%% callers would write their own frames past ones of theirs the writer still holds: out of
%% order), whether or not the count was dropped while idle; a count whose frame never comes
%% is dropped. The counters are hand_over/5's: frames at index 1, bytes at 4.
idle_counts_test_() ->
    {timeout, 30, fun() ->
        Port = open_port({spawn, "cat > /dev/null"}, [binary]),
        {W, C} = erlcuda_writer:start_link(Port),
        unlink(W),
        Frame = <<0:32>>,
        Late = fun(Jobs) ->
                       W ! {launch, Frame, 4, none},
                       ok = wait_until(fun() ->
                                               maps:get(jobs, erlcuda_writer:stats(C)) =:= Jobs
                                       end, 200),
                       ?assertEqual(0, erlcuda_writer:pending(C)),
                       ?assertEqual(0, atomics:get(C, 4))
               end,
        try
            %% counted, then sent after more than an idle period
            atomics:add(C, 1, 1),
            atomics:add(C, 4, 4),
            timer:sleep(1500),
            Late(1),
            %% counted, never sent: dropped once idle long enough
            atomics:add(C, 1, 1),
            atomics:add(C, 4, 4),
            ok = wait_until(fun() -> erlcuda_writer:pending(C) =:= 0 end, 200),
            %% and if that frame comes after all
            Late(2)
        after
            exit(W, kill),
            catch port_close(Port)
        end
    end}.

%% 1000 callers at once, each with launch_sync (list and binary formats) and launch: every
%% one gets its own right answers, nothing is left in flight, no stray message.
a_thousand_callers_test_() ->
    with_app_no_shm([], {timeout, 60, fun() ->
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

%% The port owner's own control calls never block on a busy port (a worker that stopped
%% reading while callers wrote large launches): were the owner suspended in port_command, the
%% watchdog would never fire, info/0 never answer, and the callers stay suspended for good.
%% Here the watchdog frees everyone in well under the 5 s allowed, and info/0 answers.
owner_not_blocked_by_a_busy_port_test_() ->
    with_app([{watchdog_ms, 500}], {timeout, 30, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        Big = binary:copy(<<1.0:32/float-little>>, 1 bsl 20),
        Self = self(),
        try
            os:cmd("kill -STOP " ++ integer_to_list(Pid)),
            [spawn(fun() -> Self ! {launched, catch erlcuda:launch(reduce, [Big])} end)
             || _ <- lists:seq(1, 4)],
            timer:sleep(100),
            spawn(fun() -> Self ! {info, catch erlcuda:info()} end),
            Deadline = erlang:monotonic_time(millisecond) + 5000,
            Launched = [receive {launched, R} -> R after left(Deadline) -> blocked end
                        || _ <- lists:seq(1, 4)],
            Info = receive {info, I} -> I after left(Deadline) -> blocked end,
            ?assertEqual({0, true}, {length([B || blocked = B <- Launched]), is_map(Info)})
        after
            kill9(Pid)
        end
    end}).

%% An operand frame over 4 GiB - 1 would wrap its 4-byte length: the worker would read the
%% caller's floats as frame headers, and a crafted operand could forge another caller's result.
%% Such a launch is refused with too_large. (Shared memory off: with it, such operands never
%% travel in a frame.)
frame_over_4gib_test_() ->
    with_app([{shm_dir, none}], {timeout, 60, fun() ->
        %% two operands of 2^29 + 1 floats: each is within the element limit, together
        %% they are 8 bytes over what a 4-byte length can say (one 2 GiB binary, shared)
        A = binary:copy(<<0:32>>, (1 bsl 29) + 1),
        ?assertEqual({error, too_large}, erlcuda:launch(vector_add, [A, A])),
        ?assertEqual({error, too_large}, erlcuda:launch_sync(dot_product, [A, A])),
        ?assertEqual(0, erlcuda_jobs:size()),
        ?assertEqual({ok, [2.0]}, erlcuda:launch_sync(vector_add, [[1.0], [1.0]]))
    end}).

%% A caller killed while suspended in port_command, after it registered its job, leaves
%% neither the entry nor its place in the device's queue behind, so the watchdog has no
%% reason to kill the healthy idle worker.
killed_while_writing_test_() ->
    with_app([{watchdog_ms, 3000}], {timeout, 60, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        Mb = binary:copy(<<1.0:32/float-little>>, 1 bsl 18),
        Loop = fun Loop() -> _ = erlcuda:launch(reduce, [Mb]), Loop() end,
        Callers = [spawn(Loop) || _ <- lists:seq(1, 200)],
        timer:sleep(300),
        [exit(C, kill) || C <- Callers],
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 andalso in_flight() =:= 0 end, 100),
        %% well past the watchdog's limit: the idle worker is still the same one
        timer:sleep(4000),
        ?assertMatch(#{worker_os_pid := Pid, restarts := 0}, erlcuda:info()),
        ?assertEqual({ok, 2.0}, erlcuda:launch_sync(reduce, [[2.0]]))
    end}).

%% A result no reply frame can carry is refused before anything runs: by the launch
%% itself, with no job registered (it is never computed and then refused).
result_too_large_for_a_frame_test_() ->
    with_app([], fun() ->
        ?assertEqual({error, too_large}, erlcuda:launch(matmul, [[], [], 40000, 40000, 0])),
        ?assertEqual({error, too_large},
                     erlcuda:launch_sync(matmul, [[], [], 33000, 33000, 0], [{format, binary}])),
        ?assertEqual(#{submitted => 0}, maps:with([submitted], erlcuda_jobs:counters())),
        ?assertEqual(0, erlcuda_jobs:size())
    end).

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

signal(OsPid, Sig) -> erlcuda_test_util:signal(OsPid, Sig).

kill9(OsPid) -> erlcuda_test_util:kill9(OsPid).

left(Deadline) -> erlcuda_test_util:left(Deadline).

in_flight() -> erlcuda_test_util:in_flight().

wait_until(Cond, N) -> erlcuda_test_util:wait_until(Cond, N).

no_message() -> erlcuda_test_util:no_message().

flush() -> _ = erlcuda_test_util:flush(), ok.

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
