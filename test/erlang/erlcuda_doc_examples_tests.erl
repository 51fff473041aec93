%% The Erlang examples of README.md and of every docs/*.md, run as written. A fenced
%% ```erlang block right after a line `<!-- example: Name -->' is one example, evaluated as a
%% sequence of shell expressions in a fresh process with erlcuda started (the cpu backend).
%% A word after the name says what else it needs or is:
%%
%% - `gpu': needs a GPU; run only with ERLCUDA_TEST_GPU=1 (`make test-gpu'), on the cuda
%%   backend;
%% - `cpu': shows what the cpu backend does (and the cuda one does not): run only without
%%   ERLCUDA_TEST_GPU;
%% - `cluster': needs other nodes; run by erlcuda_cluster_tests with its peers;
%% - `config': a `sys.config' (a list of `{App, Env}'): erlcuda's part must hold only known
%%   keys, each with a value the application's start accepts (erlcuda_config);
%% - `dep': a rebar3 `deps' entry for erlcuda: a git dependency at the tag of this version,
%%   `v' followed by the application's vsn.
%%
%% An example fails by raising (a failed match), as it would in a shell. Every ```erlang block
%% of the docs is an example: one without the line before it fails the suite, so that no
%% example goes unchecked.
-module(erlcuda_doc_examples_tests).

-include_lib("eunit/include/eunit.hrl").

-export([examples/0, run/1]).

-type needs() :: cpu | cpu_only | gpu | cluster | config | dep.

doc_examples_test_() ->
    Gpu = os:getenv("ERLCUDA_TEST_GPU") =:= "1",
    All = examples(),
    Runs = [E || {_, Needs, _} = E <- All,
                 Needs =:= cpu orelse Needs =:= gpu andalso Gpu
                     orelse Needs =:= cpu_only andalso not Gpu],
    Backend = case Gpu of true -> cuda; false -> cpu end,
    [{"the README and the guide have examples", fun() -> has_examples(All) end},
     {"every erlang block of the docs is an example", fun every_block_marked/0},
     {"the guide's errors table has every reason", fun guide_reasons/0},
     {"the guide's configuration table has every setting", fun guide_settings/0}]
        ++ [{"config example " ++ Name, fun() -> check_config(Code) end}
            || {Name, config, Code} <- All]
        ++ [{"dependency example " ++ Name, fun() -> check_dep(Code) end}
            || {Name, dep, Code} <- All]
        ++ [erlcuda_test_util:with_app([{backend, cpu}], [{backend, Backend}],
                                       [{"example " ++ Name, {timeout, 120, run(Code)}}
                                        || {Name, _, Code} <- Runs])].

has_examples(All) ->
    Files = lists:usort([hd(string:split(Name, ": ")) || {Name, _, _} <- All]),
    ?assert(lists:member("README.md", Files)),
    ?assert(lists:member("docs/guide.md", Files)),
    ?assert(length([N || {N, cpu, _} <- All]) >= 10).

%% @doc Every example of the README and of docs/*.md: its name (`File: Name'), what it needs
%% or is, its code.
-spec examples() -> [{string(), needs(), string()}].
examples() ->
    lists:append([[{File ++ ": " ++ Name, Needs, Code}
                   || {Name, Needs, Code} <- blocks(lines(File), [])]
                  || File <- files()]).

%% The docs: README.md, then docs/*.md, as paths from the checkout's root.
files() ->
    Root = root(),
    Docs = filelib:wildcard("docs/*.md", Root),
    ["README.md" | lists:sort(Docs)].

lines(File) ->
    {ok, Text} = file:read_file(filename:join(root(), File)),
    string:split(unicode:characters_to_list(Text), "\n", all).

blocks(["<!-- example: " ++ Rest, "```erlang" | Lines], Acc) ->
    [Spec | _] = string:split(Rest, " -->"),
    {Name, Needs} = case string:lexemes(Spec, " ") of
                        [N] -> {N, cpu};
                        [N, Kind] -> {N, needs(Kind)}
                    end,
    {Code, After} = lists:splitwith(fun(L) -> L =/= "```" end, Lines),
    blocks(After, [{Name, Needs, lists:flatten(lists:join("\n", Code))} | Acc]);
blocks([_ | Lines], Acc) ->
    blocks(Lines, Acc);
blocks([], Acc) ->
    lists:reverse(Acc).

needs("gpu") -> gpu;
needs("cpu") -> cpu_only;
needs("cluster") -> cluster;
needs("config") -> config;
needs("dep") -> dep.

every_block_marked() ->
    Unmarked = [{File, N} || File <- files(), N <- unmarked(lines(File), 1, none)],
    ?assertEqual([], Unmarked).

%% The line numbers of ```erlang blocks not right after an example line.
unmarked(["```erlang" | Lines], N, Previous) ->
    Marked = is_list(Previous) andalso lists:prefix("<!-- example: ", Previous),
    [N || not Marked] ++ unmarked(Lines, N + 1, "```erlang");
unmarked([Line | Lines], N, _) ->
    unmarked(Lines, N + 1, Line);
unmarked([], _, _) ->
    [].

%% Each reason of erlcuda's `reason()' type has a row `| `{Tag, ...}` |' or `| `tag` |' in
%% the guide.
guide_reasons() ->
    Guide = section("Errors"),
    Tags = reason_tags(),
    ?assert(length(Tags) >= 20),
    ?assertEqual([], [T || T <- Tags, not has_row(Guide, "`{" ++ atom_to_list(T) ++ ","),
                           not has_row(Guide, "`" ++ atom_to_list(T) ++ "`")]).

%% Each key of erlcuda's environment has a row `| `key` |' in the guide.
guide_settings() ->
    Guide = section("Configuration"),
    ?assertEqual([], [K || {K, _} <- erlcuda_config:keys(),
                           not has_row(Guide, "`" ++ atom_to_list(K) ++ "` |")]).

%% The lines of the guide's section `## Title', up to the next one.
section(Title) ->
    {_, [_ | Rest]} = lists:splitwith(fun(L) -> L =/= "## " ++ Title end, lines("docs/guide.md")),
    Section = lists:takewhile(fun(L) -> not lists:prefix("## ", L) end, Rest),
    lists:flatten(["\n" ++ L || L <- Section]).

has_row(Text, Cell) ->
    string:find(Text, "\n| " ++ Cell) =/= nomatch.

%% The tags of the alternatives of `erlcuda:reason()', read from the module's abstract code.
reason_tags() ->
    {ok, {erlcuda, [{abstract_code, {raw_abstract_v1, Forms}}]}} =
        beam_lib:chunks(code:which(erlcuda), [abstract_code]),
    [{type, _, union, Alternatives}] = [T || {attribute, _, type, {reason, T, []}} <- Forms],
    [tag(A) || A <- Alternatives].

tag({atom, _, Tag}) -> Tag;
tag({type, _, tuple, [{atom, _, Tag} | _]}) -> Tag.

%% @doc An example as a test: run in a process of its own, it must end without raising.
-spec run(string()) -> fun(() -> ok).
run(Code) ->
    fun() ->
            Exprs = parse(Code),
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

parse(Code) ->
    {ok, Tokens, _} = erl_scan:string(Code),
    {ok, Exprs} = erl_parse:parse_exprs(Tokens),
    Exprs.

value(Code) ->
    {value, Value, _} = erl_eval:exprs(parse(Code), []),
    Value.

%% A sys.config's erlcuda part: known keys, and values erlcuda's start accepts. Checked with
%% the application loaded but not running; its env is put back after.
check_config(Code) ->
    Config = value(Code),
    ?assert(is_list(Config)),
    {erlcuda, Env} = lists:keyfind(erlcuda, 1, Config),
    ?assertNotEqual([], Env),
    _ = application:stop(erlcuda),
    ok = case application:load(erlcuda) of
             ok -> ok;
             {error, {already_loaded, erlcuda}} -> ok
         end,
    Saved = application:get_all_env(erlcuda),
    try
        [ok = application:set_env(erlcuda, K, V) || {K, V} <- Env],
        ?assertEqual([], erlcuda_config:unknown()),
        ?assertMatch({ok, _}, erlcuda_config:load())
    after
        [ok = application:unset_env(erlcuda, K) || {K, _} <- Env],
        [ok = application:set_env(erlcuda, K, V) || {K, V} <- Saved]
    end.

%% A rebar3 deps entry: erlcuda from git at `v' and this version.
check_dep(Code) ->
    {deps, Deps} = value(Code),
    {erlcuda, {git, Url, {tag, Tag}}} = lists:keyfind(erlcuda, 1, Deps),
    ?assert(io_lib:printable_list(Url)),
    _ = application:load(erlcuda),
    {ok, Vsn} = application:get_key(erlcuda, vsn),
    ?assertEqual("v" ++ Vsn, Tag).

root() ->
    Here = filename:dirname(code:which(?MODULE)),
    hd([D || D <- ["." | ancestors(Here)], filelib:is_regular(filename:join(D, "README.md")),
             filelib:is_dir(filename:join(D, "docs"))]).

ancestors(Dir) ->
    case filename:dirname(Dir) of
        Dir -> [];
        Up -> [Up | ancestors(Up)]
    end.
