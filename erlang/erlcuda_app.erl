%% @private
%% The application's start: the checked configuration (a key it does not know is logged
%% with the nearest known one), the tables, the supervisor, and the worker's first start.
%%
%% erlcuda's log events carry `domain => [erlcuda]'. OTP's default handler logs only
%% events of no domain and of OTP's own, so in a plain `erl' none of them would show (the
%% first-run message that the Python cannot serve among them); the start adds a filter to
%% that handler that lets erlcuda's through. It is added after the handler's own filters:
%% one there that stops erlcuda's events (`logger:add_handler_filter(default, F,
%% {fun logger_filters:domain/2, {stop, sub, [erlcuda]}})') still stops them. Elixir's
%% handler logs every domain already and is left alone.
-module(erlcuda_app).
-behaviour(application).

-export([start/2, stop/1]).

-include_lib("kernel/include/logger.hrl").

%% A little beyond the worker's own start timeout, which ends its first start anyway.
-define(AWAIT_MARGIN, 5000).

-spec start(application:start_type(), term()) -> {ok, pid()} | {error, term()}.
start(_Type, _Args) ->
    ok = show_logs(),
    case erlcuda_config:load() of
        {ok, #{start_timeout := StartTimeout}} ->
            _ = [?LOG_WARNING("erlcuda: ignoring the unknown setting ~p~ts", [Key, hint(Near)],
                              #{domain => [erlcuda]})
                 || {Key, Near} <- erlcuda_config:unknown()],
            %% Created here, the tables belong to the application's own process and outlive
            %% any restart of the port owner.
            ok = erlcuda_jobs:create(),
            ok = erlcuda_status:create(),
            ok = erlcuda_shm_slots:create(),
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

hint(none) ->
    io_lib:format(" (the settings are ~ts)",
                  [lists:join(", ", [atom_to_list(K) || {K, _} <- erlcuda_config:keys()])]);
hint(Key) ->
    io_lib:format("; did you mean ~p?", [Key]).

%% Lets erlcuda's events through OTP's default handler, which would drop them (see above).
show_logs() ->
    case logger:get_handler_config(default) of
        {ok, #{filter_default := stop, filters := Filters}} ->
            case lists:keymember(erlcuda, 1, Filters) of
                true -> ok;
                false -> logger:add_handler_filter(default, erlcuda,
                                                   {fun logger_filters:domain/2,
                                                    {log, sub, [erlcuda]}})
            end;
        _ ->
            ok
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
