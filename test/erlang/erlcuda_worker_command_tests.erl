%% The worker's command line: the module run with -m and the directories put on its path
%% come from the worker_module and python_path keys, checked like every other key.
-module(erlcuda_worker_command_tests).

-include_lib("eunit/include/eunit.hrl").

command(Env) ->
    application:load(erlcuda),
    Saved = [{K, application:get_env(erlcuda, K)} || {K, _} <- Env],
    [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
    try
        {ok, Config} = erlcuda_config:load(),
        erlcuda_worker_start:worker_command(Config, none)
    after
        [case Old of
             {ok, V} -> ok = application:set_env(erlcuda, K, V);
             undefined -> ok = application:unset_env(erlcuda, K)
         end || {K, Old} <- Saved]
    end.

path_of(#{env := Env}) ->
    {"PYTHONPATH", Path} = lists:keyfind("PYTHONPATH", 1, Env),
    string:split(Path, ":", all).

default_module_and_path_test() ->
    #{args := ["-m", "erlcuda", "serve" | _]} = Cmd =
        command([{worker_module, "erlcuda"}, {python_path, []}]),
    [Ours | _] = path_of(Cmd),
    ?assertEqual(erlcuda_paths:python_dir(), Ours).

another_module_and_its_directories_first_test() ->
    Cmd = command([{worker_module, <<"erlcuda_testworker">>},
                   {python_path, ["/opt/a", <<"/opt/b">>]}]),
    ?assertMatch(#{args := ["-m", "erlcuda_testworker", "serve" | _]}, Cmd),
    ?assertMatch(["/opt/a", "/opt/b", _ | _], path_of(Cmd)),
    ?assertEqual(erlcuda_paths:python_dir(), lists:nth(3, path_of(Cmd))).

bad_values_are_bad_config_test() ->
    [begin
         application:load(erlcuda),
         Saved = application:get_env(erlcuda, K),
         ok = application:set_env(erlcuda, K, V),
         Got = erlcuda_config:load(),
         case Saved of
             {ok, Old} -> ok = application:set_env(erlcuda, K, Old);
             undefined -> ok = application:unset_env(erlcuda, K)
         end,
         ?assertMatch({error, {bad_config, K, V, <<_, _/binary>>}}, Got)
     end || {K, V} <- [{worker_module, ""}, {worker_module, "a b"}, {worker_module, "1x"},
                       {worker_module, "x."}, {python_path, "/tmp"},
                       {python_path, [""]}, {python_path, [<<>>]}, {python_path, [1]}]].
