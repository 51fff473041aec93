%% @private
-module(erlcuda_app).
-behaviour(application).

-export([start/2, stop/1]).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    %% Created here, the job tables belong to the application's own process and outlive
    %% any restart of the port server.
    ok = erlcuda_port:create_tables(),
    erlcuda_sup:start_link().

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
