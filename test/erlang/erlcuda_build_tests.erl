%% What the build makes of the sources' settings: rebar3 edoc documents the application's
%% modules alone, and the application's metadata holds nothing a package index refuses.
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
