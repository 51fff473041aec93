#!/usr/bin/env escript
%% Build step (rebar.config's post_hooks): the modules' EDoc as EEP-48 doc chunks, put
%% into each compiled module's "Docs" chunk. code:get_doc/1 reads that chunk first, so
%% `h(erlcuda)' in the Erlang shell and `h :erlcuda.launch_sync' in iex show the docs,
%% in a release too (which carries ebin/ but no doc/ directory).
-mode(compile).

main([SrcDir]) ->
    case [E || E <- ebins(), filelib:is_regular(filename:join(E, "erlcuda.beam"))] of
        [] ->
            %% A build without docs still works: say so, and go on.
            io:format(standard_error, "erlcuda_docs: no compiled erlcuda found in ~p; "
                      "the modules carry no documentation~n", [ebins()]);
        Ebins ->
            lists:foreach(fun(Ebin) -> embed_all(SrcDir, Ebin) end, Ebins)
    end.

embed_all(SrcDir, Ebin) ->
    Tmp = filename:join(Ebin, ".doc_chunks"),
    Todo = [{Src, Beam} || Src <- filelib:wildcard(filename:join(SrcDir, "*.erl")),
                           Beam <- [filename:join(Ebin, filename:basename(Src, ".erl") ++ ".beam")],
                           filelib:is_regular(Beam), not has_docs(Beam)],
    _ = [embed(Src, Beam, Tmp) || {Src, Beam} <- Todo],
    _ = file:del_dir_r(Tmp),
    ok.

%% Where the modules were put: mix names the folder; rebar3 builds a dependency under its
%% build dir's lib/, and one in _checkouts/ under checkouts/.
ebins() ->
    Env = fun(Name) -> case os:getenv(Name) of false -> []; "" -> []; V -> [V] end end,
    lists:usort(
      [filename:join(D, "ebin") || D <- Env("REBAR_BARE_COMPILER_OUTPUT_DIR")]
      ++ [filename:join([D, "erlcuda", "ebin"]) || D <- Env("REBAR_CHECKOUTS_OUT_DIR")]
      ++ [filename:join([D, Sub, "erlcuda", "ebin"]) || D <- Env("REBAR_BUILD_DIR"),
                                                      Sub <- ["lib", "checkouts"]]).

has_docs(Beam) ->
    case beam_lib:chunks(Beam, ["Docs"]) of
        {ok, _} -> true;
        _ -> false
    end.

embed(Src, Beam, Tmp) ->
    Mod = filename:basename(Src, ".erl"),
    ok = edoc:files([Src], [{doclet, edoc_doclet_chunks}, {layout, edoc_layout_chunks},
                            {dir, Tmp}, {preprocess, true},
                            {includes, [filename:dirname(Src)]}]),
    {ok, Docs} = file:read_file(filename:join([Tmp, "chunks", Mod ++ ".chunk"])),
    {ok, _, Chunks} = beam_lib:all_chunks(Beam),
    {ok, Module} = beam_lib:build_module(Chunks ++ [{"Docs", Docs}]),
    ok = file:write_file(Beam, Module).
