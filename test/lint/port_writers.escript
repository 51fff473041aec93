#!/usr/bin/env escript
%% `make lint': fails when a module of the application other than erlcuda_writer writes the
%% worker's port (`port_command', `erlang:port_command' or a `{Pid, {command, Data}}'
%% message), from the tokens of the sources in the folder given (comments and strings are
%% not tokens that match).
-define(WRITER, "erlcuda_writer.erl").

main([Dir]) ->
    Files = filelib:wildcard(filename:join(Dir, "*.erl")),
    case [{filename:basename(F), Line} || F <- Files, filename:basename(F) =/= ?WRITER,
                                          Line <- writes(F)] of
        [] ->
            io:format("one module writes the port~n");
        Found ->
            [io:format(standard_error, "~s:~b writes the port; only ~s may~n",
                       [File, Line, ?WRITER]) || {File, Line} <- Found],
            halt(1)
    end;
main(_) ->
    io:format(standard_error, "usage: port_writers.escript SOURCE_DIR~n", []),
    halt(2).

%% The lines where a file writes a port.
writes(File) ->
    {ok, Bin} = file:read_file(File),
    {ok, Tokens, _} = erl_scan:string(unicode:characters_to_list(Bin)),
    find(Tokens).

find([{atom, L, port_command}, {'(', _} | Rest]) -> [L | find(Rest)];
find([{'{', L}, {atom, _, command}, {',', _} | Rest]) -> [L | find(Rest)];
find([_ | Rest]) -> find(Rest);
find([]) -> [].
