%% @private
-module(erlcuda_app).
-behaviour(application).

-export([start/2, stop/1]).

%% A little beyond the worker's own start timeout, which ends its first start anyway.
-define(AWAIT_MARGIN, 5000).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    case erlcuda_config:load() of
        {ok, #{start_timeout := StartTimeout}} ->
            %% Created here, the tables belong to the application's own process and outlive
            %% any restart of the port owner.
            ok = erlcuda_jobs:create(),
            ok = erlcuda_status:create(),
            ok = erlcuda_buffers:create(),
            ok = erlcuda_cluster:create(),
            %% Loaded modules belong to one start of the application.
            ok = erlcuda_catalogue:reset(),
            ok = erlcuda_telemetry:init(),
            case erlcuda_sup:start_link() of
                {ok, Sup} ->
                    %% The application is ready once the worker's first start has ended,
                    %% answered or failed (a failed one is retried in the background).
                    case erlcuda_worker:await_ready(StartTimeout + ?AWAIT_MARGIN) of
                        ok ->
                            {ok, Sup};
                        {error, _} = Error ->
                            stop_sup(Sup),
                            Error
                    end;
                Other ->
                    Other
            end;
        {error, _} = Error ->
            Error
    end.

%% Stopped before the start returns, so that a start tried again finds no supervisor.
stop_sup(Sup) ->
    Ref = monitor(process, Sup),
    unlink(Sup),
    exit(Sup, shutdown),
    receive {'DOWN', Ref, process, Sup, _} -> ok end.

-spec stop(term()) -> ok.
stop(_State) ->
    ok.
