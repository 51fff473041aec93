#!/usr/bin/env escript
%% Build step (rebar.config's post_hooks): the Elixir face of the API (the Erlcuda module and
%% its structs, erlang/elixir/) compiled with elixirc into the application's ebin and named
%% in its .app, so that a release loads it like any module of the application. Where
%% elixirc is not on the PATH the build goes on without it: the Erlang API is complete on
%% its own. A mix project that depends on erlcuda builds it with rebar3, with mix's own
%% Elixir on the PATH, so its modules are compiled by the Elixir that runs them.
-mode(compile).

%% Every module of the Elixir sources is named Erlcuda or Erlcuda.*; elixirc names the
%% protocol implementations for their structs Inspect.Erlcuda.*.
-define(OURS, ["Elixir.Erlcuda.beam", "Elixir.Erlcuda.*.beam", "Elixir.Inspect.Erlcuda.*.beam"]).

main([SrcDir]) ->
    Sources = filelib:wildcard(filename:join(SrcDir, "**/*.ex")),
    Ebins = [E || E <- ebins(), filelib:is_regular(filename:join(E, "erlcuda.beam"))],
    case os:find_executable("elixirc") of
        false ->
            io:format(standard_error, "erlcuda: elixirc is not on the PATH, so the Elixir "
                      "modules (Erlcuda) are not built; the Erlang API (erlcuda) is "
                      "complete without them~n", []);
        _ when Sources =:= [] ->
            ok;
        Elixirc ->
            lists:foreach(fun(Ebin) -> build(Elixirc, Sources, Ebin) end, Ebins)
    end.

%% Where the modules were put, as erlcuda_docs.escript finds them: mix names the folder;
%% rebar3 builds a dependency under its build dir's lib/, and one in _checkouts/ under
%% checkouts/.
ebins() ->
    Env = fun(Name) -> case os:getenv(Name) of false -> []; "" -> []; V -> [V] end end,
    lists:usort(
      [filename:join(D, "ebin") || D <- Env("REBAR_BARE_COMPILER_OUTPUT_DIR")]
      ++ [filename:join([D, "erlcuda", "ebin"]) || D <- Env("REBAR_CHECKOUTS_OUT_DIR")]
      ++ [filename:join([D, Sub, "erlcuda", "ebin"]) || D <- Env("REBAR_BUILD_DIR"),
                                                      Sub <- ["lib", "checkouts"]]).

build(Elixirc, Sources, Ebin) ->
    case up_to_date(Sources, ours(Ebin)) of
        true -> ok;
        false -> compile(Elixirc, Sources, Ebin)
    end,
    list_in_app(Ebin, [list_to_atom(filename:basename(B, ".beam")) || B <- ours(Ebin)]).

ours(Ebin) ->
    lists:usort(lists:append([filelib:wildcard(filename:join(Ebin, P)) || P <- ?OURS])).

%% Compiled after the newest source was written. The times are whole seconds, so a source
%% written in the second its modules were compiled counts as newer.
up_to_date(_, []) ->
    false;
up_to_date(Sources, Beams) ->
    lists:max([filelib:last_modified(S) || S <- Sources])
        < lists:min([filelib:last_modified(B) || B <- Beams]).

%% The modules of an earlier build go first, so that none of a renamed or removed source
%% stays behind; the compiler sees the Erlang modules (-pa) to check the calls into them.
compile(Elixirc, Sources, Ebin) ->
    _ = [ok = file:delete(B) || B <- ours(Ebin)],
    Port = open_port({spawn_executable, Elixirc},
                     [{args, ["-o", Ebin, "-pa", Ebin | Sources]}, exit_status,
                      stderr_to_stdout, binary]),
    case collect(Port, []) of
        {0, Output} ->
            io:put_chars(Output);
        {Status, Output} ->
            io:put_chars(standard_error, Output),
            io:format(standard_error, "erlcuda: elixirc failed (exit status ~b) on ~s~n",
                      [Status, filename:dirname(hd(Sources))]),
            halt(1)
    end.

collect(Port, Acc) ->
    receive
        {Port, {data, Data}} -> collect(Port, [Acc, Data]);
        {Port, {exit_status, Status}} -> {Status, Acc}
    end.

%% The .app's module list names the Elixir modules too: a release's boot script loads the
%% modules that list names.
list_in_app(Ebin, Modules) ->
    App = filename:join(Ebin, "erlcuda.app"),
    {ok, [{application, erlcuda, Keys}]} = file:consult(App),
    Listed = proplists:get_value(modules, Keys, []),
    case Modules -- Listed of
        [] ->
            ok;
        Missing ->
            New = {application, erlcuda,
                   lists:keystore(modules, 1, Keys, {modules, Listed ++ Missing})},
            ok = file:write_file(App, unicode:characters_to_binary(io_lib:format("~tp.~n", [New])))
    end.
