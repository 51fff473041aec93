%% A hostile review of the Erlang side: each test named bug_* shows a defect and fails on
%% the code it was written against; each test named holds_* checks a promise that held.
%% CPU backend, the worker's test double (test/worker). Sub-nodes are used where the
%% defect aborts the whole VM.
-module(erlcuda_hostile_tests).

-include_lib("eunit/include/eunit.hrl").

%% A telemetry stand-in whose handlers fail (see the telemetry tests).
-export([execute/3]).

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 2}, {worker_module, "erlcuda_testworker"}, {python_path, erlcuda_test_util:test_worker_path()}, {max_queue, 10000},
                   {watchdog_ms, 30000}, {python, default}, {start_timeout, 120000}]).
%% keys some tests set that are not in ?DEFAULTS: unset after each test
-define(EXTRA, [telemetry_module]).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

reset() ->
    erlcuda_test_util:reset(?DEFAULTS, ?EXTRA).

%%% Defects.

%% 1. info/0 must answer a map in every state. An info call that is waiting for the worker
%% when the worker dies is answered {error, {worker_down, _}} by fail_calls/2.
bug_info_during_worker_death_test_() ->
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

%% 3. A control call handled after the port has closed but before its exit_status message
%% is handled makes send_call/4's `true = port_command(...)' raise badarg: the port owner
%% crashes (and the info caller exits). sys:suspend/1 only widens a window that a busy owner
%% (forwarding many results) opens by itself.
bug_call_on_closed_port_crashes_owner_test_() ->
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

%% 4. The watchdog also runs in `starting': a worker whose start takes longer than
%% watchdog_ms (well within start_timeout) is killed as stuck as soon as one job waits
%% for it, and every restart is killed the same way while jobs keep coming.
bug_watchdog_kills_slow_start_test_() ->
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

%% 5. Telemetry must never break a launch. A [erlcuda, job, start] handler that raises
%% makes launch/3 raise in the caller after its place in the device queue was taken: the
%% queue counter never comes back to 0.
bug_telemetry_start_raises_test_() ->
    with_app([{telemetry_module, ?MODULE}], {timeout, 20, fun() ->
        R = (catch erlcuda:launch(dot_product, [[1.0], [1.0]])),
        flush(),
        _ = wait_until(fun() -> in_flight() =:= 0 end, 20),
        ?assertEqual({true, 0}, {is_reply(R), in_flight()})
    end}).

%% 6. A [erlcuda, job, stop] handler that raises runs in the port owner after the job was
%% taken from the table and before its reply is sent: the job gets no reply at all and the
%% owner crashes (restarting the worker, failing every other job in flight).
bug_telemetry_stop_raises_test_() ->
    with_app([{telemetry_module, ?MODULE}], {timeout, 20, fun() ->
        ?assertEqual({ok, [2.0]},
                     erlcuda:launch_sync(vector_add, [[1.0], [1.0]], [{timeout, 3000}]))
    end}).

execute([erlcuda, job, start], _, #{kernel := dot_product}) -> error(handler_bug);
execute([erlcuda, job, stop], _, #{kernel := vector_add}) -> error(handler_bug);
execute(_, _, _) -> ok.

%% 7. cpu_devices is checked only as a positive integer; the port owner then sizes the
%% queue counters with atomics:new(cpu_devices): a large value aborts the whole VM
%% ("Cannot allocate ... erl_bif_atomics") instead of failing the start with bad_config.
bug_huge_cpu_devices_aborts_vm_test_() ->
    {timeout, 60, fun() ->
        Fake = fake_worker(#{devices => 1}),
        Out = subnode("application:set_env(erlcuda, cpu_devices, 1 bsl 40), "
                      "application:set_env(erlcuda, python, \"" ++ Fake ++ "\"), "
                      "io:format(\"start ~p~n\", [application:start(erlcuda)]), "
                      "io:format(\"node alive~n\")"),
        ?assertMatch({match, _}, re:run(Out, "bad_config,cpu_devices"))
    end}.

%% 8. The worker's hello is trusted for its device count: a worker that says
%% devices => 1 bsl 40 aborts the node in erlcuda_status:set_up/3 (atomics:new). A crash
%% on the worker's side must never take the node down.
bug_hello_device_count_aborts_vm_test_() ->
    {timeout, 60, fun() ->
        Fake = fake_worker(#{devices => 1 bsl 40}),
        Out = subnode("application:set_env(erlcuda, python, \"" ++ Fake ++ "\"), "
                      "application:set_env(erlcuda, start_timeout, 3000), "
                      "io:format(\"start ~p~n\", [application:start(erlcuda)]), "
                      "io:format(\"node alive~n\")"),
        ?assertMatch({match, _}, re:run(Out, "node alive"))
    end}.

%% 9. The worker's info answer is trusted for its shape: device_info that is not a list of
%% maps crashes the port owner in merge_info/3 (and exits the info/0 caller).
bug_malformed_device_info_crashes_owner_test_() ->
    Fake = fake_worker(#{devices => 1, device_info => not_a_list}),
    with_app([{python, Fake}, {start_timeout, 5000}], {timeout, 20, fun() ->
        Owner = whereis(erlcuda_worker),
        Info = (catch erlcuda:info()),
        timer:sleep(100),
        ?assertEqual({true, Owner}, {is_map(Info), whereis(erlcuda_worker)})
    end}).

%% 10. start_timeout is checked only as a positive integer, but the application's start
%% waits start_timeout + 5000 in a gen_statem:call: above 4294967295 - 5000 that raises
%% timeout_value, and the start fails with bad_return instead of {bad_config, _, _}.
bug_huge_start_timeout_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda), application:load(erlcuda) end,
     fun(_) -> reset() end,
     fun() ->
         [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
         ok = application:set_env(erlcuda, start_timeout, 1 bsl 33),
         Got = application:start(erlcuda),
         ?assertMatch({error, {{bad_config, start_timeout, _}, _}}, Got)
     end}.

%% 11. A port owner that dies without terminate/3 (killed, or past its shutdown time) leaves
%% a worker that does not read its input running for as long as the node lives: the next
%% owner starts a second worker and nothing ever kills the first.
bug_orphan_after_owner_killed_test_() ->
    with_app([], {timeout, 30, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        try
            os:cmd("kill -STOP " ++ integer_to_list(Pid)),
            exit(whereis(erlcuda_worker), kill),
            erlcuda_test_util:wait_restarted(Pid, 50),
            ?assertEqual(ok, wait_until(fun() -> not os_alive(Pid) end, 20))
        after
            kill9(Pid)
        end
    end}).

%% 12. Each restart re-reads the application env and matches {ok, Config}: one bad value
%% set at run time (a typo in a remote shell) crashes the port owner at the next worker
%% death, again in init/1 at each supervisor restart, and the whole application stops -
%% the crash loop that "the port owner restarts the worker itself" is meant to rule out.
bug_runtime_bad_env_stops_app_test_() ->
    with_app([], {timeout, 20, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        ok = application:set_env(erlcuda, max_queue, 0),
        kill9(Pid),
        timer:sleep(1500),
        ok = application:set_env(erlcuda, max_queue, 10000),
        Running = lists:keymember(erlcuda, 1, application:which_applications()),
        _ = (catch erlcuda_test_util:wait_restarted(Pid, 20)),
        ?assertEqual({true, {ok, 1.0}}, {Running, erlcuda:launch_sync(reduce, [[1.0]])})
    end}).

%%% Promises that held.

%% Bad input of any shape: a documented {error, Reason} from launch and launch_sync alike,
%% never an exception; the service goes on, no stray message, the counters stay at 0.
holds_hostile_input_test_() ->
    with_app([], fun() ->
        Big = 1 bsl 1000,
        Cases =
            [{unknown_kernel, self(), [[1.0]], []},
             {unknown_kernel, <<"reduce">>, [[1.0]], []},
             {unknown_kernel, "reduce", [[1.0]], []},
             {bad_args, reduce, #{a => 1}, []},
             {bad_args, reduce, [[1.0] | x], []},
             {bad_args, reduce, [[1.0, [2.0]]], []},
             {bad_args, reduce, [[<<1.0:32/float>>]], []},
             {bad_args, reduce, [[Big]], []},
             {bad_args, reduce, [[-Big]], []},
             {bad_args, reduce, [[3.5e38]], []},
             {bad_args, reduce, [[340282356779733661637539395458142568448]], []},
             {bad_args, reduce, [<<1:7>>], []},
             {bad_args, reduce, [{1.0}], []},
             {bad_args, matmul, [[1.0], [1.0], true, 1, 1], []},
             {bad_args, matmul, [[1.0], [1.0], 1, 1, 1 bsl 200], []},
             {bad_args, matmul, [<<>>, <<>>, 0, 0, 1 bsl 31], []},
             {bad_args, matmul, [[], [], -1, 0, 0], []},
             {bad_device, reduce, [[1.0]], [{device, 1 bsl 64}]},
             {bad_device, reduce, [[1.0]], [{device, 2}]},
             {bad_device, reduce, [[1.0]], [{device, "0"}]},
             {bad_option, reduce, [[1.0]], {device, 0}},
             {bad_option, reduce, [[1.0]], [{device, 0} | {}]},
             {bad_option, reduce, [[1.0]], [{format, <<"binary">>}]},
             {bad_option, reduce, [[1.0]], [{trace, 1}]},
             {bad_option, reduce, [[1.0]], [{timeout, -1}]},
             {bad_option, reduce, [[1.0]], [{timeout, 1.5}]},
             {bad_option, reduce, [[1.0]], [{timeout, 1 bsl 32}]},
             {bad_option, reduce, [[1.0]], [{device, 0, extra}]},
             {bad_option, reduce, [[1.0]], [device]},
             {bad_option, reduce, [[1.0]], [[]]},
             {bad_option, reduce, [[1.0]], #{"device" => 0}},
             {bad_option, reduce, [[1.0]], #{device => any, bogus => 1}}],
        lists:foreach(
          fun({Tag, Kernel, Args, Opts} = Case) ->
                  Async = (catch erlcuda:launch(Kernel, Args, Opts)),
                  Sync = (catch erlcuda:launch_sync(Kernel, Args, Opts)),
                  ?assertEqual({Case, Async}, {Case, Sync}),
                  ?assertMatch({_, {error, {Tag, _}}}, {Case, Async})
          end, Cases),
        ?assertEqual({ok, 1.0}, erlcuda:launch_sync(reduce, [[1.0]], #{device => any})),
        ?assertEqual({ok, <<>>}, erlcuda:launch_sync(vector_add, [[], <<>>],
                                                     [{format, binary}])),
        timer:sleep(100),
        no_message(),
        ?assertEqual({0, 0}, {in_flight(), erlcuda_jobs:size()})
    end).

%% launch_sync's timeout: no late reply reaches the caller, also with trace; the job's
%% entry and queue place go once the late reply comes.
holds_no_stray_after_timeout_test_() ->
    with_app([], {timeout, 20, fun() ->
        erlcuda_test_util:stall(0, 500),
        ?assertEqual({error, timeout}, erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 0}])),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(reduce, [[1.0]], [{timeout, 20}, {trace, true}])),
        ?assertEqual({error, timeout},
                     erlcuda:launch_sync(reduce, [[1.0]], #{timeout => 50, device => 0})),
        flush_stalled(),
        timer:sleep(300),
        no_message(),
        ?assertEqual({0, 0}, {in_flight(), erlcuda_jobs:size()})
    end}).

%% Launches racing two worker deaths and restarts: every {ok, Id} gets exactly one reply,
%% and the table and queue counters are empty afterwards.
holds_one_reply_across_restarts_test_() ->
    with_app([], {timeout, 40, fun() ->
        Self = self(),
        Deadline = erlang:monotonic_time(millisecond) + 1500,
        Launchers = [spawn(fun() -> Self ! {report, self(), launcher(Deadline, [])} end)
                     || _ <- lists:seq(1, 8)],
        #{worker_os_pid := P1} = erlcuda:info(),
        timer:sleep(300),
        kill9(P1),
        erlcuda_test_util:wait_restarted(P1, 50),
        #{worker_os_pid := P2} = erlcuda:info(),
        timer:sleep(100),
        kill9(P2),
        Reports = [receive {report, L, R} -> R after 20000 -> error(launcher_hung) end
                   || L <- Launchers],
        ?debugFmt("launched, lost, duplicated: ~p", [Reports]),
        ?assertEqual([], [R || {_, Lost, Dups} = R <- Reports, Lost + Dups > 0]),
        erlcuda_test_util:wait_restarted(P2, 50),
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

%% Stopping the application reaps a worker that no longer reads its input.
holds_stop_reaps_stopped_worker_test_() ->
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

left(Deadline) ->
    max(0, Deadline - erlang:monotonic_time(millisecond)).

is_reply({ok, _}) -> true;
is_reply({error, _}) -> true;
is_reply(_) -> false.

in_flight() -> erlcuda_test_util:in_flight().

kill9(Pid) ->
    _ = os:cmd("kill -9 " ++ integer_to_list(Pid) ++ " 2>/dev/null"),
    ok.

os_alive(Pid) ->
    filelib:is_dir("/proc/" ++ integer_to_list(Pid)).

wait_until(_, 0) -> timeout;
wait_until(Cond, N) ->
    case catch Cond() of
        true -> ok;
        _ -> timer:sleep(100), wait_until(Cond, N - 1)
    end.

flush_stalled() ->
    receive {stalled, _} -> ok after 6000 -> ok end.

flush() ->
    receive M -> [M | flush()] after 0 -> [] end.

no_message() -> erlcuda_test_util:no_message().
