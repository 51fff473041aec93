%% The README's Erlang examples, run as written. A fenced ```erlang block right after a line
%% `<!-- example: Name -->' is one example, evaluated as a sequence of shell expressions in
%% a fresh process with erlcuda started (the cpu backend); `<!-- example: Name gpu -->'
%% marks one that needs a GPU, run only with ERLCUDA_TEST_GPU=1 (`make test-gpu') on the
%% cuda backend; `<!-- example: Name cluster -->' one that needs other nodes, run by
%% erlcuda_cluster_tests with its peers. An example fails by raising (a failed match), as it
%% would in a shell.
-module(erlcuda_readme_tests).

-include_lib("eunit/include/eunit.hrl").

-export([examples/0, run/1]).

readme_test_() ->
    Gpu = os:getenv("ERLCUDA_TEST_GPU") =:= "1",
    Examples = [E || {_, Needs, _} = E <- examples(),
                     Needs =:= cpu orelse Needs =:= gpu andalso Gpu],
    Backend = case Gpu of true -> cuda; false -> cpu end,
    [{"the README has examples", fun() -> ?assert(length(examples()) >= 3) end}
     | erlcuda_test_util:with_app([{backend, cpu}], [{backend, Backend}],
                                  [{"README example " ++ Name, {timeout, 120, run(Code)}}
                                   || {Name, _, Code} <- Examples])].

%% @doc Every example of the README: its name, whether it needs a GPU or a cluster, its code.
-spec examples() -> [{string(), cpu | gpu | cluster, string()}].
examples() ->
    {ok, Text} = file:read_file(readme()),
    blocks(string:split(unicode:characters_to_list(Text), "\n", all), []).

blocks(["<!-- example: " ++ Rest, "```erlang" | Lines], Acc) ->
    [Spec | _] = string:split(Rest, " -->"),
    {Name, Needs} = case string:lexemes(Spec, " ") of
                        [N, "gpu"] -> {N, gpu};
                        [N, "cluster"] -> {N, cluster};
                        [N] -> {N, cpu}
                    end,
    {Code, After} = lists:splitwith(fun(L) -> L =/= "```" end, Lines),
    blocks(After, [{Name, Needs, lists:flatten(lists:join("\n", Code))} | Acc]);
blocks([_ | Lines], Acc) ->
    blocks(Lines, Acc);
blocks([], Acc) ->
    lists:reverse(Acc).

%% @doc An example as a test: run in a process of its own, it must end without raising.
-spec run(string()) -> fun(() -> ok).
run(Code) ->
    fun() ->
            {ok, Tokens, _} = erl_scan:string(Code),
            {ok, Exprs} = erl_parse:parse_exprs(Tokens),
            %% Its own process: an example's messages and links stay its own.
            {Pid, Ref} = spawn_monitor(fun() ->
                                               {value, _, _} = erl_eval:exprs(Exprs, []),
                                               exit(done)
                                       end),
            receive
                {'DOWN', Ref, process, Pid, Why} -> ?assertEqual(done, Why)
            after 100000 ->
                    exit(Pid, kill),
                    error(example_timed_out)
            end
    end.

readme() ->
    Here = filename:dirname(code:which(?MODULE)),
    hd([F || F <- [filename:join(D, "README.md")
                   || D <- ["." | ancestors(Here)]], filelib:is_regular(F)]).

ancestors(Dir) ->
    case filename:dirname(Dir) of
        Dir -> [];
        Up -> [Up | ancestors(Up)]
    end.
