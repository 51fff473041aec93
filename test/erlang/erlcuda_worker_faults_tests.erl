%% The port owner (erlcuda_worker) and its worker's life cycle under faults: info/0 and
%% control calls while the worker dies, the watchdog and slow starts, a worker's hello or info
%% that cannot be trusted (device counts, malformed device info, another version), no worker
%% left behind when the owner is killed, the application stops or the node halts, one reply
%% per job across restarts, and workers that are stuck, missing, hang in their start, exit at
%% once, or ask for a backend that is not there. CPU backend, the worker's test double
%% (test/worker), stand-in workers and sub-nodes where a fault would abort the whole VM.
-module(erlcuda_worker_faults_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, erlcuda_test_util:fault_defaults()).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

reset() ->
    erlcuda_test_util:reset(?DEFAULTS, []).

%% info/0 answers a map in every state, also an info call that is waiting for the worker
%% when the worker dies.
info_during_worker_death_test_() ->
    with_app([], {timeout, 20, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        %% the worker's control thread is busy for 3 s: the info call waits behind it
        erlcuda_test_util:stall(0, 3000),
        Self = self(),
        spawn(fun() -> Self ! {info, catch erlcuda:info()} end),
        timer:sleep(200),
        kill9(Pid),
        Info = receive {info, I} -> I after 5000 -> no_answer end,
        flush_stalled(),
        ?assert(is_map(Info))
    end}).

%% A control call handled after the port has closed but before its exit_status message is
%% handled is answered, and the port owner stays up (a port_command on the closed port would
%% raise badarg in it). sys:suspend/1 only widens a window that a busy owner (forwarding many
%% results) opens by itself.
call_on_a_closed_port_keeps_the_owner_test_() ->
    with_app([], {timeout, 20, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        Owner = whereis(erlcuda_worker),
        ok = sys:suspend(Owner),
        Self = self(),
        spawn(fun() -> Self ! {info, catch erlcuda:info()} end),
        timer:sleep(50),
        kill9(Pid),
        timer:sleep(300),
        ok = sys:resume(Owner),
        Info = receive {info, I} -> I after 12000 -> no_answer end,
        timer:sleep(200),
        ?assertEqual({true, Owner}, {is_map(Info), whereis(erlcuda_worker)})
    end}).

%% The watchdog looks at a running worker only: a worker whose start takes longer than
%% watchdog_ms (well within start_timeout) is not killed as stuck when a job waits for it,
%% else every restart would be killed the same way while jobs keep coming.
watchdog_spares_a_slow_start_test_() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Slow = filename:join(Dir, "slow_python"),
    ok = file:write_file(Slow, ["#!/bin/sh\nsleep 1.5\nexec ", erlcuda_paths:python(default),
                                " \"$@\"\n"]),
    ok = file:change_mode(Slow, 8#755),
    with_app([{python, Slow}, {watchdog_ms, 300}, {start_timeout, 20000}],
             {timeout, 30, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        kill9(Pid),
        ok = wait_until(fun() -> maps:get(worker_status, erlcuda:info()) =:= starting end, 50),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 10000}]))
    end}).

%% The port owner sizes the queue counters by cpu_devices (atomics:new/2): a value that large
%% would abort the whole VM ("Cannot allocate ... erl_bif_atomics"); the start fails with
%% bad_config instead.
huge_cpu_devices_is_bad_config_test_() ->
    {timeout, 60, fun() ->
        Fake = fake_worker(#{devices => 1}),
        Out = subnode("application:set_env(erlcuda, cpu_devices, 1 bsl 40), "
                      "application:set_env(erlcuda, python, \"" ++ Fake ++ "\"), "
                      "io:format(\"start ~p~n\", [application:start(erlcuda)]), "
                      "io:format(\"node alive~n\")"),
        ?assertMatch({match, _}, re:run(Out, "bad_config,cpu_devices"))
    end}.

%% The worker's hello is not trusted for its device count: a worker that says
%% devices => 1 bsl 40 must not abort the node in erlcuda_status:set_up/3 (atomics:new). A
%% crash on the worker's side must never take the node down.
hello_device_count_keeps_the_node_test_() ->
    {timeout, 60, fun() ->
        Fake = fake_worker(#{devices => 1 bsl 40}),
        Out = subnode("application:set_env(erlcuda, python, \"" ++ Fake ++ "\"), "
                      "application:set_env(erlcuda, start_timeout, 3000), "
                      "io:format(\"start ~p~n\", [application:start(erlcuda)]), "
                      "io:format(\"node alive~n\")"),
        ?assertMatch({match, _}, re:run(Out, "node alive"))
    end}.

%% The worker's info answer is not trusted for its shape: device_info that is not a list of
%% maps still gets info/0 a map, and the port owner stays up.
malformed_device_info_keeps_the_owner_test_() ->
    Fake = fake_worker(#{devices => 1, device_info => not_a_list}),
    with_app([{python, Fake}, {start_timeout, 5000}], {timeout, 20, fun() ->
        Owner = whereis(erlcuda_worker),
        Info = (catch erlcuda:info()),
        timer:sleep(100),
        ?assertEqual({true, Owner}, {is_map(Info), whereis(erlcuda_worker)})
    end}).

%% A port owner that dies without terminate/3 (killed, or past its shutdown time) leaves no
%% worker behind, even one that does not read its input: the next owner starts a second
%% worker, and the first must not run on for as long as the node lives.
no_orphan_after_owner_killed_test_() ->
    with_app([], {timeout, 30, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        try
            os:cmd("kill -STOP " ++ integer_to_list(Pid)),
            exit(whereis(erlcuda_worker), kill),
            erlcuda_test_util:wait_restarted(Pid, 300),
            ?assertEqual(ok, wait_until(fun() -> not os_alive(Pid) end, 20))
        after
            kill9(Pid)
        end
    end}).

%% halt() of the node while the worker is stopped (SIGSTOP) leaves no orphaned worker.
no_orphan_after_halt_test_() ->
    {timeout, 60, fun() ->
        Ebin = filename:dirname(code:which(erlcuda)),
        Eval = "application:load(erlcuda), application:set_env(erlcuda, backend, cpu), "
               "{ok, _} = application:ensure_all_started(erlcuda), "
               "#{worker_os_pid := P} = erlcuda:info(), io:format(\"worker ~b~n\", [P]), "
               "os:cmd(\"kill -STOP \" ++ integer_to_list(P)), halt().",
        Out = os:cmd("erl -noshell -pa " ++ Ebin ++ " -eval '" ++ Eval ++ "' 2>&1"),
        {match, [Pid]} = re:run(Out, "worker ([0-9]+)", [{capture, all_but_first, list}]),
        Gone = wait_until(fun() -> not filelib:is_dir("/proc/" ++ Pid) end, 50),
        _ = [os:cmd("kill -9 " ++ Pid) || Gone =/= ok],
        ?assertEqual(ok, Gone)
    end}.

%% Stopping the application reaps a worker that no longer reads its input.
stop_reaps_stopped_worker_test_() ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             application:load(erlcuda),
             [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
             {ok, _} = application:ensure_all_started(erlcuda)
     end,
     fun(_) -> reset() end,
     {timeout, 20, fun() ->
         #{worker_os_pid := Pid} = erlcuda:info(),
         os:cmd("kill -STOP " ++ integer_to_list(Pid)),
         ok = application:stop(erlcuda),
         Gone = wait_until(fun() -> not os_alive(Pid) end, 10),
         kill9(Pid),
         ?assertEqual(ok, Gone)
     end}}.

%% The port owner never waits in a receive for the worker's hello (up to start_timeout):
%% info() answers while a worker starts, and launches are answered.
never_blocks_while_starting_test_() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Script = filename:join(Dir, "slow"),
    ok = file:write_file(Script, "#!/bin/sh\nexec sleep 60\n"),
    ok = file:change_mode(Script, 8#755),
    with_app([{python, Script}, {start_timeout, 2000}], {timeout, 30, fun() ->
        %% info/0 answers while a start is under way (one that waited for the start would
        %% only ever see it ended), and through the restarts after it.
        Statuses = poll_info(erlang:monotonic_time(millisecond) + 5000, []),
        ?assert(lists:member(starting, Statuses)),
        case erlcuda:launch(reduce, [[1.0]]) of
            {error, {worker_down, _}} -> ok;
            {ok, Id} -> receive {erlcuda, Id, {error, {worker_down, _}}} -> ok
                        after 5000 -> error(no_reply)
                        end
        end
    end}).

poll_info(Deadline, Seen) ->
    case erlang:monotonic_time(millisecond) > Deadline of
        true ->
            Seen;
        false ->
            #{worker_status := Status} = erlcuda:info(),
            timer:sleep(50),
            poll_info(Deadline, [Status | Seen])
    end.

%% A worker of another version is refused with a reason that names both versions.
version_mismatch_test() ->
    application:load(erlcuda),
    Info = #{backend => cpu, devices => 1, status => ok, version => <<"0.0.1">>,
             protocol => 1},
    {unavailable, Why} = erlcuda_worker_start:check_hello(Info),
    ?assertMatch({match, _}, re:run(Why, "version mismatch.*0\\.0\\.1")),
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    ?assertEqual(ok, erlcuda_worker_start:check_hello(
                       Info#{version => list_to_binary(Vsn),
                             protocol => erlcuda_contract:protocol()})).

%% Launches racing two worker deaths and restarts: every {ok, Id} gets exactly one reply,
%% and the table and queue counters are empty afterwards.
one_reply_across_restarts_test_() ->
    with_app([], {timeout, 40, fun() ->
        Self = self(),
        Deadline = erlang:monotonic_time(millisecond) + 1500,
        Launchers = [spawn(fun() -> Self ! {report, self(), launcher(Deadline, [])} end)
                     || _ <- lists:seq(1, 8)],
        #{worker_os_pid := P1} = erlcuda:info(),
        timer:sleep(300),
        kill9(P1),
        erlcuda_test_util:wait_restarted(P1, 300),
        #{worker_os_pid := P2} = erlcuda:info(),
        timer:sleep(100),
        kill9(P2),
        Reports = [receive {report, L, R} -> R after 20000 -> error(launcher_hung) end
                   || L <- Launchers],
        ?debugFmt("launched, lost, duplicated: ~p", [Reports]),
        ?assertEqual([], [R || {_, Lost, Dups} = R <- Reports, Lost + Dups > 0]),
        erlcuda_test_util:wait_restarted(P2, 300),
        ok = wait_until(fun() -> erlcuda_jobs:size() =:= 0 andalso in_flight() =:= 0 end, 30)
    end}).

launcher(Deadline, Ids) ->
    case erlang:monotonic_time(millisecond) > Deadline of
        true ->
            Until = Deadline + 5000,
            Lost = length([Id || Id <- Ids,
                                 receive {erlcuda, Id, _} -> false
                                 after left(Until) -> true
                                 end]),
            timer:sleep(200),
            Dups = length(flush()),
            {length(Ids), Lost, Dups};
        false ->
            Next = case erlcuda:launch(reduce, [[1.0]], [{device, any}]) of
                       {ok, Id} -> [Id | Ids];
                       {error, {worker_down, _}} -> Ids
                   end,
            timer:sleep(1),
            launcher(Deadline, Next)
    end.

%% docs/guide.md, Options: with {trace, true} "the reply is {erlcuda, JobId, Result, Stamps};
%% launch_sync answers {ok, R, Stamps} or {error, Why, Stamps}". A traced job answered by
%% the Erlang side (worker death, fail_all; the sweep) keeps that shape, so a traced caller
%% that matches the documented shape sees its reply. (Shared memory off, as for the other
%% tests of protocol 3.)
traced_job_failed_by_erlang_keeps_its_shape_test_() ->
    with_app([{shm_dir, none}], {timeout, 30, fun() ->
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

%%% Workers that are stuck, or cannot start. These run with four devices.

stuck_worker_test_() ->
    with_app([{cpu_devices, 4}, {watchdog_ms, 300}], {timeout, 30, fun stuck_worker/0}).

stuck_worker() ->
    #{worker_os_pid := Pid} = erlcuda:info(),
    erlcuda_test_util:stall(0, 20000),
    T0 = erlang:monotonic_time(millisecond),
    ?assertMatch({error, {worker_down, {stuck, _}}},
                 erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 10000}])),
    ?debugFmt("stuck worker detected after ~b ms", [erlang:monotonic_time(millisecond) - T0]),
    erlcuda_test_util:wait_restarted(Pid, 100),
    ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]])).

no_python_test_() ->
    with_app([{cpu_devices, 4}, {python, "/nonexistent/python3"}], {timeout, 30, fun no_python/0}).

no_python() ->
    %% Answered by the calls themselves, with no job left waiting for a worker: the
    %% interpreter is not there (erlcuda_python_tests says what the reason tells).
    ?assertMatch({error, {bad_python, _}}, erlcuda:launch(reduce, [[1.0]])),
    ?assertMatch({error, {bad_python, _}}, erlcuda:launch_sync(reduce, [[1.0]])),
    ?assertEqual(0, erlcuda_jobs:size()),
    ?assertMatch(#{worker_os_pid := undefined}, erlcuda:info()).

hanging_start_test_() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Script = filename:join(Dir, "hangs"),
    ok = file:write_file(Script, ["#!/bin/sh\necho $$ >> ", Dir, "/pids\nexec sleep 60\n"]),
    ok = file:change_mode(Script, 8#755),
    with_app([{cpu_devices, 4}, {python, Script}, {start_timeout, 300}],
             {timeout, 30, fun() -> hanging_start(Dir) end}).

%% A worker that never answers its hello is killed, not left behind, and every launch is
%% answered worker_down (at once while the worker is down, or once its start times out).
hanging_start(Dir) ->
    case erlcuda:launch(reduce, [[1.0]]) of
        {error, Why} -> ?assertMatch({worker_down, _}, Why);
        {ok, Id} -> receive {erlcuda, Id, R} -> ?assertMatch({error, {worker_down, _}}, R)
                    after 5000 -> error(no_reply)
                    end
    end,
    timer:sleep(1000),
    {ok, Pids} = file:read_file(filename:join(Dir, "pids")),
    [_, _ | _] = Started = string:lexemes(binary_to_list(Pids), "\n"),
    %% every worker but the newest (which may still be in its start) has been killed
    Alive = [P || P <- lists:droplast(Started),
                  os:cmd("kill -0 " ++ P ++ " 2>/dev/null && printf alive") =:= "alive"],
    ?assertEqual([], Alive),
    #{last_down_reason := start_timeout} = erlcuda:info().

worker_exits_at_once_test_() ->
    with_app([{cpu_devices, 4}, {python, "/bin/false"}], {timeout, 30, fun worker_exits_at_once/0}).

worker_exits_at_once() ->
    timer:sleep(1000),
    %% /bin/false runs no Python either: the check of the interpreter says so
    ?assertMatch({error, {bad_python, _}}, erlcuda:launch_sync(reduce, [[1.0]])),
    #{restarts := Restarts} = erlcuda:info(),
    %% backing off: a few restarts in a second, not a spin
    ?assert(Restarts >= 1 andalso Restarts < 12).

%% backend = cuda asked for where it cannot start (no PyCUDA or no GPU, as in CI): the worker
%% still runs and every launch answers backend_unavailable at once, with the reason.
cuda_unavailable_test_() ->
    with_app([{cpu_devices, 4}, {backend, cuda}], fun cuda_unavailable/0).

cuda_unavailable() ->
    case erlcuda:info() of
        #{status := ok, backend := cuda} ->
            ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]));
        Info ->
            ?assertMatch(#{backend := cuda, status := {backend_unavailable, _}}, Info),
            {error, {backend_unavailable, Why}} = erlcuda:launch(reduce, [[1.0]]),
            ?assert(is_binary(Why) andalso byte_size(Why) > 0),
            ?assertMatch({error, {backend_unavailable, _}},
                         erlcuda:launch_sync(vector_add, [[1.0], [2.0]]))
    end.

%%% Helpers.

%% A stand-in worker (the `python' it is started as): it answers every control call,
%% hello included, with Info merged into a valid hello, and ignores every launch.
fake_worker(Info) ->
    _ = application:load(erlcuda),
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    Answer = maps:merge(#{backend => cpu, devices => 1, status => ok,
                          version => list_to_binary(Vsn),
                          protocol => erlcuda_contract:protocol(),
                          device_info => [#{jobs => 0, launches => 0, max_batch => 0,
                                            errors => 0, queue => 0}]}, Info),
    <<131, Body/binary>> = term_to_binary(Answer),
    Hex = binary:encode_hex(Body),
    Dir = string:trim(os:cmd("mktemp -d")),
    Script = filename:join(Dir, "fake_worker"),
    ok = file:write_file(Script, [
        "#!", erlcuda_paths:python(default), "\n"
        "import os, struct\n"
        "REPLY = bytes.fromhex('", Hex, "')\n"
        "def read(n):\n"
        "    b = b''\n"
        "    while len(b) < n:\n"
        "        c = os.read(3, n - len(b))\n"
        "        if not c:\n"
        "            os._exit(0)\n"
        "        b += c\n"
        "    return b\n"
        "while True:\n"
        "    (n,) = struct.unpack('>I', read(4))\n"
        "    f = read(n)\n"
        "    if f[1:3] != b'h\\x05':\n"
        "        continue\n"
        "    i = 3\n"
        "    if f[i] in (100, 118):\n"
        "        i += 3 + int.from_bytes(f[i + 1:i + 3], 'big')\n"
        "    else:\n"
        "        i += 2 + f[i + 1]\n"
        "    j = i + (2 if f[i] == 97 else 5)\n"
        "    body = b'\\x83h\\x03w\\x01r' + f[i:j] + REPLY\n"
        "    os.write(4, struct.pack('>I', len(body)) + body)\n"]),
    ok = file:change_mode(Script, 8#755),
    Script.

%% Run Eval in a fresh node with erlcuda loaded (backend cpu); its output.
subnode(Eval) ->
    Ebin = filename:dirname(code:which(erlcuda)),
    All = "application:load(erlcuda), application:set_env(erlcuda, backend, cpu), "
          ++ Eval ++ ", halt().",
    os:cmd("ERL_CRASH_DUMP=/dev/null ERL_CRASH_DUMP_SECONDS=0 timeout 50 erl -noshell -pa "
           ++ Ebin ++ " -eval '" ++ All ++ "' 2>&1").

left(Deadline) -> erlcuda_test_util:left(Deadline).

in_flight() -> erlcuda_test_util:in_flight().

kill9(Pid) -> erlcuda_test_util:kill9(Pid).

os_alive(Pid) ->
    filelib:is_dir("/proc/" ++ integer_to_list(Pid)).

%% A Cond that raises counts as not holding yet (erlcuda_test_util:wait_for/2).
wait_until(Cond, N) -> erlcuda_test_util:wait_for(Cond, N).

flush_stalled() -> erlcuda_test_util:flush_stalled().

flush() -> erlcuda_test_util:flush().
