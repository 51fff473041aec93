#!/usr/bin/env escript
%% `make lint': fails when modules of the application call each other in a cycle (two
%% modules calling each other both ways included), from xref's module call graph of the
%% compiled application in the folder given.
main([Ebin]) ->
    {ok, _} = xref:start(cycles),
    ok = xref:set_default(cycles, [{warnings, false}, {verbose, false}]),
    {ok, _} = xref:add_directory(cycles, Ebin),
    {ok, Components} = xref:q(cycles, "components (ME || AM)"),
    case [lists:sort(C) || C <- Components, length(C) > 1] of
        [] ->
            io:format("no module call cycles~n");
        Cycles ->
            [io:format(standard_error, "modules calling each other in a cycle: ~p~n", [C])
             || C <- Cycles],
            halt(1)
    end;
main(_) ->
    io:format(standard_error, "usage: cycles.escript EBIN~n", []),
    halt(2).
