%% The application's configuration: bad values refused when the application starts (with
%% {bad_config, Key, Value, Allowed}), keys it does not know reported with the nearest known
%% one, a bad value set at run time that must not stop the application,
%% text settings given as binaries, and the paths of the worker's code and of its Python
%% (erlcuda_paths). CPU backend, the worker's test double (test/worker).
-module(erlcuda_config_tests).

-include_lib("eunit/include/eunit.hrl").

-define(DEFAULTS, erlcuda_test_util:fault_defaults()).

with_app(Env, Test) ->
    erlcuda_test_util:with_app(?DEFAULTS, Env, Test).

reset() ->
    erlcuda_test_util:reset(?DEFAULTS, []).

%% Bad application config does not start the application (else every launch would answer
%% worker_down while the worker restarted forever, and info() say backend => undefined): the
%% start fails with {bad_config, Key, Value, Allowed}.
bad_config_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda), application:load(erlcuda) end,
     fun(_) -> [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS] end,
     fun() ->
         Bad = [{backend, gpu}, {cpu_devices, 0}, {max_queue, -1}, {python, 42},
                {watchdog_ms, soon}, {spin_us, -5}, {batching, yes}, {worker_args, "-x"},
                {start_timeout, infinity}, {worker_module, "-m os"}, {worker_module, "a..b"},
                {worker_module, 'erlcuda'}, {python_path, "/tmp"}, {python_path, [42]},
                {shm_threshold, 0}, {shm_threshold, manual}, {shm_keep_ms, 0},
                {shm_keep_ms, infinity}, {caller_spin_us, -1}, {caller_spin_us, 20000}],
         lists:foreach(
           fun({K, V}) ->
                   Saved = application:get_env(erlcuda, K),
                   ok = application:set_env(erlcuda, K, V),
                   Got = application:start(erlcuda),
                   case Saved of
                       {ok, Old} -> ok = application:set_env(erlcuda, K, Old);
                       undefined -> ok = application:unset_env(erlcuda, K)
                   end,
                   {error, {{bad_config, K, V, Allowed}, _}} = Got,
                   ?assert(is_binary(Allowed) andalso byte_size(Allowed) > 0),
                   ?assertEqual(false, lists:keymember(erlcuda, 1,
                                                       application:which_applications()))
           end, Bad)
     end}.

%% The application's start waits start_timeout + 5000 in a gen_statem:call: a start_timeout
%% above 4294967295 - 5000 fails the start with {bad_config, start_timeout, _, _} (rather than a
%% timeout_value raised in that call, a bad_return).
huge_start_timeout_is_bad_config_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda), application:load(erlcuda) end,
     fun(_) -> reset() end,
     fun() ->
         [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
         ok = application:set_env(erlcuda, start_timeout, 1 bsl 33),
         Got = application:start(erlcuda),
         ?assertMatch({error, {{bad_config, start_timeout, _, _}, _}}, Got)
     end}.

%% A wrong value's reason says what the key takes.
allowed_values_test() ->
    Got = [with_env(K, V, fun erlcuda_config:load/0)
           || {K, V} <- [{backend, gpu}, {on_bad_python, maybe}, {cpu_devices, 0}]],
    ?assertEqual([{error, {bad_config, backend, gpu, <<"auto, cpu or cuda">>}},
                  {error, {bad_config, on_bad_python, maybe, <<"retry or fail">>}},
                  {error, {bad_config, cpu_devices, 0,
                           iolist_to_binary(["an integer from 1 to ",
                                             integer_to_list(erlcuda_status:max_devices())])}}],
                 Got).

%% A key erlcuda does not know (a typo) is reported with the known key nearest to it.
unknown_keys_test() ->
    Got = with_env(backnd, cpu, fun() ->
              with_env(watchdog, 100, fun() ->
                  with_env(zzz_unrelated, 1, fun erlcuda_config:unknown/0)
              end)
          end),
    ?assertEqual([{backnd, backend}, {watchdog, watchdog_ms}, {zzz_unrelated, none}], Got).

%% ... and the application's start logs it, naming the key and the nearest one.
unknown_key_is_logged_test_() ->
    {setup,
     fun() -> _ = application:stop(erlcuda), application:load(erlcuda) end,
     fun(_) ->
             _ = logger:remove_handler(erlcuda_unknown_key),
             erlcuda_test_util:reset(?DEFAULTS, [backnd])
     end,
     {timeout, 60, fun() ->
         ok = logger:add_handler(erlcuda_unknown_key, erlcuda_test_util,
                                 #{config => #{pid => self()}, level => all}),
         [ok = application:set_env(erlcuda, K, V) || {K, V} <- ?DEFAULTS],
         ok = application:set_env(erlcuda, backnd, cpu),
         {ok, _} = application:ensure_all_started(erlcuda),
         Warnings = [iolist_to_binary(io_lib:format(F, A))
                     || {logged, #{level := warning, msg := {F, A}, meta := #{domain := [erlcuda]}}}
                            <- erlcuda_test_util:flush()],
         ?assertMatch([_], [W || W <- Warnings, string:find(W, "backnd") =/= nomatch,
                                 string:find(W, "did you mean backend") =/= nomatch])
     end}}.

%% Fun() with the application env Key set to Value, then as it was.
with_env(Key, Value, Fun) ->
    application:load(erlcuda),
    Saved = application:get_env(erlcuda, Key),
    ok = application:set_env(erlcuda, Key, Value),
    try
        Fun()
    after
        case Saved of
            {ok, Old} -> ok = application:set_env(erlcuda, Key, Old);
            undefined -> ok = application:unset_env(erlcuda, Key)
        end
    end.

%% Each restart re-reads the application env: one bad value set at run time (a typo in a
%% remote shell) must not crash the port owner at the next worker death and again at each
%% supervisor restart until the whole application stops - the crash loop that "the port owner
%% restarts the worker itself" is meant to rule out.
runtime_bad_env_keeps_the_app_running_test_() ->
    with_app([], {timeout, 20, fun() ->
        #{worker_os_pid := Pid} = erlcuda:info(),
        ok = application:set_env(erlcuda, max_queue, 0),
        kill9(Pid),
        timer:sleep(1500),
        ok = application:set_env(erlcuda, max_queue, 10000),
        Running = lists:keymember(erlcuda, 1, application:which_applications()),
        _ = (catch erlcuda_test_util:wait_restarted(Pid, 300)),
        ?assertEqual({true, {ok, 1.0}}, {Running, erlcuda:launch_sync(reduce, [[1.0]])})
    end}).

%% Elixir writes strings as binaries: `config :erlcuda, python: "/usr/bin/python3"' is
%% taken as a text setting, as its list form is.
text_settings_as_binaries_test_() ->
    application:load(erlcuda),
    Python = list_to_binary(erlcuda_paths:python(default)),
    with_app([{python, Python}, {worker_args, [<<"--spin-us">>, <<"0">>]}], fun() ->
        ?assertEqual({ok, 3.0}, erlcuda:launch_sync(reduce, [[1.0, 2.0]]))
    end).

paths_test() ->
    %% the worker's code comes from the application's priv dir (a release has no checkout)
    Dir = erlcuda_paths:python_dir(),
    ?assertEqual(filename:absname(filename:join(code:priv_dir(erlcuda), "python")), Dir),
    ?assert(filelib:is_regular(filename:join([Dir, "erlcuda", "__init__.py"]))),
    Saved = os:getenv("ERLCUDA_PYTHON"),
    os:putenv("ERLCUDA_PYTHON", "/opt/python-of-choice"),
    ?assertEqual("/opt/python-of-choice", erlcuda_paths:python(default)),
    os:unsetenv("ERLCUDA_PYTHON"),
    ?assertEqual("/usr/bin/python9", erlcuda_paths:python("/usr/bin/python9")),
    _ = [os:putenv("ERLCUDA_PYTHON", Saved) || is_list(Saved)],
    ok.

kill9(Pid) -> erlcuda_test_util:kill9(Pid).
