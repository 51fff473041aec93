%% The check of the worker's interpreter (erlcuda_python) and what the port owner does with
%% its verdict: a Python that cannot serve is `{bad_python, Detail}' from every launch and
%% in info/0, logged once, retried with a growing back-off by the probe alone, and with
%% `{on_bad_python, fail}' the application's start fails with it. The Python without numpy
%% is the machine's own with site-packages off (`-S'), as a Debian python3 without
%% python3-numpy is; a first run on a plain node shows it once, and nothing raw.
-module(erlcuda_python_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, [{backend, cpu}, {cpu_devices, 1}, {worker_module, "erlcuda"},
                   {python_path, []}, {python, default}, {start_timeout, 120000},
                   {on_bad_python, retry}]).

%%% The verdict on the probe's output.

config() ->
    #{worker_module => "erlcuda"}.

probe_lines(Lines) ->
    iolist_to_binary([["erlcuda-probe\t", lists:join("\t", L), "\n"] || L <- Lines]).

good() ->
    [["executable", "ok", "/opt/py/bin/python"], ["python", "ok", "3.11.2"],
     ["numpy", "ok", "2.1.0"], ["pycuda", "missing", "ModuleNotFoundError: No module named 'pycuda'"],
     ["erlcuda", "ok", "0.2.0"]].

a_python_that_serves_is_ok_test() ->
    %% PyCUDA is the cuda backend's alone: the worker runs without it
    ?assertEqual(ok, erlcuda_python:verdict({"/opt/py/bin/python", <<"from $ERLCUDA_PYTHON">>},
                                            config(), 0, probe_lines(good()))).

numpy_missing_test() ->
    Lines = [case L of
                 ["numpy" | _] -> ["numpy", "missing",
                                   "ModuleNotFoundError: No module named 'numpy'"];
                 _ -> L
             end || L <- good()],
    {bad_python, Detail} = erlcuda_python:verdict({"/usr/bin/python3", <<"python3 on the PATH">>},
                                                  config(), 0, probe_lines(Lines)),
    [?assertNotEqual(nomatch, string:find(Detail, Part))
     || Part <- ["/usr/bin/python3 (python3 on the PATH, Python 3.11.2)",
                 "numpy does not import (ModuleNotFoundError: No module named 'numpy')",
                 "Fix: python3 -m venv", "ERLCUDA_PYTHON="]].

an_old_python_and_a_missing_module_test() ->
    Lines = [["python", "old", "3.8.10 (erlcuda needs 3.10 or later)"]
             | tl(tl(good()))] ++ [["module", "missing", "no module named my_worker"]],
    {bad_python, Detail} = erlcuda_python:verdict({"/usr/bin/python3", <<"x">>},
                                                  #{worker_module => "my_worker"}, 0,
                                                  probe_lines(Lines)),
    [?assertNotEqual(nomatch, string:find(Detail, Part))
     || Part <- ["Python 3.8.10 (erlcuda needs 3.10 or later) is too old",
                 "the worker module my_worker is not found", "python3 -m venv",
                 "check the worker_module and python_path settings"]].

not_a_python_test() ->
    {bad_python, Detail} = erlcuda_python:verdict({"/bin/false", <<"x">>}, config(), 1, <<>>),
    ?assertNotEqual(nomatch, string:find(Detail, "exit status 1, printed nothing")),
    {bad_python, Said} = erlcuda_python:verdict({"/bin/echo", <<"x">>}, config(), 0,
                                                <<"-c import sys\nprint(1)\n">>),
    ?assertNotEqual(nomatch, string:find(Said, "printed \"-c import sys print(1)\"")).

spawn_failures_test() ->
    {bad_python, NotFound} = erlcuda_python:spawn_failure({"/no/python", <<"x">>}, enoent),
    ?assertNotEqual(nomatch, string:find(NotFound, "/no/python (x) was not found")),
    {bad_python, _} = erlcuda_python:spawn_failure({"/etc/hosts", <<"x">>}, eacces),
    ?assertEqual(none, erlcuda_python:spawn_failure({"/usr/bin/python3", <<"x">>}, emfile)).

%%% The port owner with a Python without numpy.

%% A Python without numpy: the machine's, with site-packages off. Each run appends a line to
%% the file `runs' beside it.
no_numpy_python() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Script = filename:join(Dir, "python_without_numpy"),
    ok = file:write_file(Script, ["#!/bin/sh\necho run >> ", Dir, "/runs\n"
                                  "exec ", erlcuda_paths:python(default), " -S \"$@\"\n"]),
    ok = file:change_mode(Script, 8#755),
    Script.

runs(Script) ->
    case file:read_file(filename:join(filename:dirname(Script), "runs")) of
        {ok, Bin} -> length(binary:matches(Bin, <<"run">>));
        {error, enoent} -> 0
    end.

%% Test run with erlcuda's env set (the application not started), and afterwards the
%% handler `Id' (the test adds it: `listen/1') removed and erlcuda stopped.
with_handler(Id, Env, Test) ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             application:load(erlcuda),
             [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS ++ Env]
     end,
     fun(_) ->
             _ = logger:remove_handler(Id),
             erlcuda_test_util:reset(?DEFAULTS, [])
     end,
     Test}.

%% Every log event from now on is sent to the caller ({logged, Event}).
listen(Id) ->
    ok = logger:add_handler(Id, erlcuda_test_util, #{config => #{pid => self()}, level => all}).

%% The events logged so far, formatted.
logged() ->
    [iolist_to_binary(case Msg of
                          {string, S} -> S;
                          {F, A} when is_list(F) -> io_lib:format(F, A);
                          {report, R} -> io_lib:format("~p", [R])
                      end) || {logged, #{msg := Msg}} <- erlcuda_test_util:flush()].

matching(Events, Text) ->
    [E || E <- Events, string:find(E, Text) =/= nomatch].

bad_python_test_() ->
    Script = no_numpy_python(),
    with_handler(erlcuda_bad_python, [{python, Script}], {timeout, 90, fun() ->
        listen(erlcuda_bad_python),
        {ok, _} = application:ensure_all_started(erlcuda),
        {error, {bad_python, Detail}} = erlcuda:launch(reduce, [[1.0]]),
        [?assertNotEqual(nomatch, string:find(Detail, Part))
         || Part <- [Script, "numpy does not import", "Fix: "]],
        ?assertEqual({error, {bad_python, Detail}}, erlcuda:launch_sync(reduce, [[1.0]])),
        ?assertEqual({error, {bad_python, Detail}}, erlcuda_worker:call(info, [], 5000)),
        ?assertMatch(#{worker_status := {bad_python, Detail}, status := {bad_python, Detail},
                       worker_os_pid := undefined}, erlcuda:info()),
        %% the retries back off, the probe alone runs, and none logs again
        ok = erlcuda_test_util:wait_for(fun() -> maps:get(restarts, erlcuda:info()) >= 7 end,
                                        300),
        #{restarts := Restarts, backoff_ms := Backoff} = erlcuda:info(),
        ?assertEqual(min(100 bsl (Restarts - 1), 60000), Backoff),
        ?assert(Backoff > 5000),
        %% one run of the worker, then one of the probe a start (the next may have begun)
        ?assert(lists:member(runs(Script) - (Restarts + 1), [0, 1])),
        Events = logged(),
        ?assertMatch([_], matching(Events, "cannot run the erlcuda worker")),
        %% the worker's own traceback came through the logger, not raw
        ?assertMatch([_ | _], matching(Events, "No module named 'numpy'")),
        ?assertEqual({error, {bad_python, Detail}}, erlcuda:launch(reduce, [[1.0]]))
    end}).

%% A Python made fine (here: the setting pointed at a good one) is found by the next check,
%% and the worker starts.
fixed_python_test_() ->
    Script = no_numpy_python(),
    with_handler(erlcuda_fixed_python, [{python, Script}], {timeout, 60, fun() ->
        {ok, _} = application:ensure_all_started(erlcuda),
        ?assertMatch({error, {bad_python, _}}, erlcuda:launch(reduce, [[1.0]])),
        ok = application:set_env(erlcuda, python, default),
        ok = erlcuda_test_util:wait_for(
               fun() -> maps:get(worker_status, erlcuda:info()) =:= up end, 300),
        ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
    end}).

not_found_test_() ->
    with_handler(erlcuda_no_python, [{python, "/nonexistent/python3"}], {timeout, 60, fun() ->
        {ok, _} = application:ensure_all_started(erlcuda),
        {error, {bad_python, Detail}} = erlcuda:launch(reduce, [[1.0]]),
        ?assertNotEqual(nomatch, string:find(Detail, "/nonexistent/python3 (from erlcuda's "
                                                     "python setting) was not found"))
    end}).

%% {on_bad_python, fail}: the application does not start, and says why.
fail_option_test_() ->
    Script = no_numpy_python(),
    with_handler(erlcuda_fail_python, [{python, Script}, {on_bad_python, fail}],
                 {timeout, 60, fun() ->
        {error, {{bad_python, Detail}, _}} = application:start(erlcuda),
        ?assertNotEqual(nomatch, string:find(Detail, "numpy does not import")),
        ?assertEqual(undefined, whereis(erlcuda_worker)),
        ?assertEqual(false, lists:keymember(erlcuda, 1, application:which_applications())),
        ok = application:set_env(erlcuda, on_bad_python, yes),
        ?assertMatch({error, {{bad_config, on_bad_python, yes, <<"retry or fail">>}, _}},
                     application:start(erlcuda))
    end}).

%% A newcomer's first run, in a plain node with OTP's own logger set-up: the message shows
%% once (OTP's default handler drops events of other domains than OTP's unless erlcuda's
%% start lets erlcuda's through), and nothing goes raw to the console's stderr.
first_run_on_a_plain_node_test_() ->
    {timeout, 90, fun() ->
        Script = no_numpy_python(),
        Dir = filename:dirname(Script),
        Ebin = filename:dirname(code:which(erlcuda)),
        Eval = "application:load(erlcuda), application:set_env(erlcuda, backend, cpu), "
               "application:set_env(erlcuda, python, \"" ++ Script ++ "\"), "
               "{ok, _} = application:ensure_all_started(erlcuda), "
               "io:format(\"launch: ~p~n\", [element(1, element(2, erlcuda:launch(reduce, [[1.0]])))]), "
               "timer:sleep(2000), halt().",
        Out = os:cmd("env -u ERLCUDA_PYTHON ERL_CRASH_DUMP=/dev/null timeout 60 erl -noshell -pa "
                     ++ Ebin ++ " -eval '" ++ Eval ++ "' 2>" ++ Dir ++ "/stderr"),
        {ok, Err} = file:read_file(filename:join(Dir, "stderr")),
        ?assertEqual(1, length(string:split(Out, "cannot run the erlcuda worker", all)) - 1),
        ?assertNotEqual(nomatch, string:find(Out, "launch: bad_python")),
        ?assertEqual(<<>>, Err)
    end}.
