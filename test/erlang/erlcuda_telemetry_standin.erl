%% Stands in for the optional telemetry application: forwards each event to the process
%% registered as erlcuda_telemetry_events.
-module(erlcuda_telemetry_standin).

-export([execute/3]).

execute(Event, Measurements, Metadata) ->
    case whereis(erlcuda_telemetry_events) of
        undefined -> ok;
        Pid -> Pid ! {telemetry, Event, Measurements, Metadata}, ok
    end.
