%% What the build makes of the sources' settings: rebar3 edoc documents the application's
%% modules alone, the application's metadata holds nothing a package index refuses, and the
%% Elixir modules are built into the ebin where elixirc is found, and only there.
-module(erlcuda_build_tests).

-include_lib("eunit/include/eunit.hrl").

root() ->
    filename:dirname(filename:dirname(filename:dirname(filename:absname(?FILE)))).

%% rebar3 edoc runs edoc:application/3 with rebar.config's edoc_opts: with none, EDoc read
%% every .erl of the checkout (there is no src/) and wrote pages for the tests, the
%% benchmarks and the release samples.
edoc_documents_the_application_alone_test_() ->
    {timeout, 120, fun() ->
        Root = root(),
        {ok, Config} = file:consult(filename:join(Root, "rebar.config")),
        Opts = proplists:get_value(edoc_opts, Config, []),
        Out = string:trim(os:cmd("mktemp -d")),
        {ok, Cwd} = file:get_cwd(),
        ok = file:set_cwd(Root),
        try
            ok = edoc:application(erlcuda, Root, Opts ++ [{dir, Out}])
        after
            ok = file:set_cwd(Cwd)
        end,
        Pages = [filename:basename(F, ".html") || F <- filelib:wildcard("*.html", Out)],
        Ours = [filename:basename(F, ".erl")
                || F <- filelib:wildcard(filename:join([Root, "erlang", "*.erl"]))],
        ?assertEqual([], [P || P <- Pages, not lists:member(P, Ours),
                               not lists:member(P, ["index", "modules-frame",
                                                    "overview-summary"])]),
        ?assert(lists:member("erlcuda", Pages))
    end}.

%% hex.pm takes http(s) URLs alone as links; an empty list said nothing.
app_links_are_urls_or_absent_test() ->
    {ok, [{application, erlcuda, Keys}]} =
        file:consult(filename:join([root(), "erlang", "erlcuda.app.src"])),
    case lists:keyfind(links, 1, Keys) of
        false ->
            ok;
        {links, Links} ->
            ?assertNotEqual([], Links),
            [?assertMatch({match, _}, re:run(URL, "^https?://[^/\\s]+\\.[^/\\s]+"))
             || {_, URL} <- Links]
    end.

%% The Elixir step of the build (erlang/erlcuda_elixir.escript), run as rebar3 runs it on a
%% build folder of its own, holding the compiled Erlang application as rebar3 leaves it
%% before the step (its beams, and a .app that names them alone), with the PATH given:
%% {{ExitStatus, Output}, Ebin}.
elixir_step(Path) ->
    Ebin = filename:join([string:trim(os:cmd("mktemp -d")), "lib", "erlcuda", "ebin"]),
    ok = filelib:ensure_dir(filename:join(Ebin, "x")),
    From = filename:join(code:lib_dir(erlcuda), "ebin"),
    [{ok, _} = file:copy(F, filename:join(Ebin, filename:basename(F)))
     || F <- filelib:wildcard(filename:join(From, "erlcuda*.beam"))],
    {ok, [{application, erlcuda, Keys}]} = file:consult(filename:join(From, "erlcuda.app")),
    Erlang = [M || M <- proplists:get_value(modules, Keys), not is_elixir(M)],
    App = {application, erlcuda, lists:keystore(modules, 1, Keys, {modules, Erlang})},
    ok = file:write_file(filename:join(Ebin, "erlcuda.app"), io_lib:format("~p.~n", [App])),
    {elixir_run(Ebin, Path), Ebin}.

is_elixir(Module) ->
    lists:prefix("Elixir.", atom_to_list(Module)).

elixir_run(Ebin, Path) ->
    Root = root(),
    BuildDir = filename:dirname(filename:dirname(filename:dirname(Ebin))),
    Port = open_port({spawn_executable, os:find_executable("escript")},
                     [{args, [filename:join([Root, "erlang", "erlcuda_elixir.escript"]),
                              filename:join([Root, "erlang", "elixir"])]},
                      {cd, Root}, exit_status, stderr_to_stdout, binary,
                      {env, [{"PATH", Path}, {"REBAR_BUILD_DIR", BuildDir},
                             {"REBAR_BARE_COMPILER_OUTPUT_DIR", false},
                             {"REBAR_CHECKOUTS_OUT_DIR", false}]}]),
    collect(Port, <<>>).

collect(Port, Acc) ->
    receive
        {Port, {data, Data}} -> collect(Port, <<Acc/binary, Data/binary>>);
        {Port, {exit_status, Status}} -> {Status, Acc}
    end.

elixir_modules(Ebin) ->
    [filename:basename(F) || F <- filelib:wildcard(filename:join(Ebin, "Elixir.*.beam"))].

app_modules(Ebin) ->
    {ok, [{application, erlcuda, Keys}]} = file:consult(filename:join(Ebin, "erlcuda.app")),
    proplists:get_value(modules, Keys).

%% A folder holding one executable script, `elixirc', that prints a line and exits 3.
failing_elixirc() ->
    Dir = string:trim(os:cmd("mktemp -d")),
    Elixirc = filename:join(Dir, "elixirc"),
    ok = file:write_file(Elixirc, "#!/bin/sh\necho 'elixirc: it broke'\nexit 3\n"),
    ok = file:change_mode(Elixirc, 8#755),
    Dir.

%% No elixirc on the PATH: the build goes on, says so, and the ebin is as it was.
elixir_step_without_elixir_test_() ->
    {timeout, 60, fun() ->
        Empty = string:trim(os:cmd("mktemp -d")),
        {{Status, Output}, Ebin} = elixir_step(Empty),
        ?assertEqual(0, Status),
        ?assertNotEqual(nomatch, binary:match(Output, <<"elixirc is not on the PATH">>)),
        ?assertEqual([], elixir_modules(Ebin)),
        ?assertEqual([], [M || M <- app_modules(Ebin), is_elixir(M)])
    end}.

%% An elixirc that fails fails the build, with its output: a broken Elixir face never
%% passes as a missing one.
elixir_step_with_a_failing_elixirc_test_() ->
    {timeout, 60, fun() ->
        {{Status, Output}, Ebin} = elixir_step(failing_elixirc()),
        ?assertEqual(1, Status),
        ?assertNotEqual(nomatch, binary:match(Output, <<"elixirc: it broke">>)),
        ?assertNotEqual(nomatch, binary:match(Output, <<"elixirc failed (exit status 3)">>)),
        ?assertEqual([], elixir_modules(Ebin))
    end}.

%% With Elixir installed: the modules are compiled into the ebin and named in the .app (a
%% release's boot script loads what the .app names), and compiled again only when a source
%% is newer than they are.
elixir_step_with_elixir_test_() ->
    case os:find_executable("elixirc") of
        false ->
            [];
        Elixirc ->
            {timeout, 120, fun() -> elixir_built(filename:dirname(Elixirc)) end}
    end.

elixir_built(Bin) ->
    Path = Bin ++ ":/usr/bin:/bin",
    {{0, _}, Ebin} = elixir_step(Path),
    Built = elixir_modules(Ebin),
    ?assert(lists:member("Elixir.Erlcuda.beam", Built)),
    ?assert(lists:member("Elixir.Erlcuda.Buffer.beam", Built)),
    ?assert(lists:member("Elixir.Inspect.Erlcuda.Buffer.beam", Built)),
    Listed = [atom_to_list(M) ++ ".beam" || M <- app_modules(Ebin)],
    ?assertEqual([], Built -- Listed),
    ?assert(lists:member("erlcuda.beam", Listed)),
    Beam = filename:join(Ebin, "Elixir.Erlcuda.beam"),
    %% up to date: nothing is compiled, so a failing elixirc is never run
    Before = filelib:last_modified(Beam),
    ?assertMatch({0, _}, elixir_run(Ebin, failing_elixirc() ++ ":" ++ Path)),
    ?assertEqual(Before, filelib:last_modified(Beam)),
    %% a module of an earlier build that no source makes any more goes
    Stale = filename:join(Ebin, "Elixir.Erlcuda.Gone.beam"),
    {ok, _} = file:copy(Beam, Stale),
    ok = file:change_time(Stale, {{2000, 1, 1}, {0, 0, 0}}),
    ?assertMatch({0, _}, elixir_run(Ebin, Path)),
    ?assertNot(filelib:is_regular(Stale)),
    ?assertEqual(Built, elixir_modules(Ebin)),
    %% file times are whole seconds: a source of the second the modules were compiled in
    %% is newer than they are (here the elixirc that fails is run, and fails the step)
    Sources = filelib:wildcard(filename:join([root(), "erlang", "elixir", "**", "*.ex"])),
    [ok = file:change_time(B, lists:max([filelib:last_modified(S) || S <- Sources]))
     || B <- filelib:wildcard(filename:join(Ebin, "Elixir.*.beam"))],
    ?assertMatch({1, _}, elixir_run(Ebin, failing_elixirc() ++ ":" ++ Path)).
