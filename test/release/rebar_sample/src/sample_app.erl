%% Runs one job on each device at start, prints the results, and stops the node.
-module(sample_app).
-behaviour(application).

-export([start/2, stop/1]).

start(_Type, _Args) ->
    Pid = spawn(fun() ->
                        Info = erlcuda:info(),
                        Sum = erlcuda:launch_sync(vector_add, [[1.0, 2.0], [3.0, 4.0]],
                                                  [{device, 1}]),
                        io:format("sample: backend ~p, ~p device(s), vector_add -> ~p~n",
                                  [maps:get(backend, Info), maps:get(devices, Info), Sum]),
                        init:stop()
                end),
    {ok, Pid}.

stop(_State) ->
    ok.
