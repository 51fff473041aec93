%% The part of the telemetry library's API that erlcuda and its tests use (`attach/4',
%% `attach_many/4', `detach/1', `execute/3', `list_handlers/1'), with telemetry's meaning:
%% handlers run in the process that calls `execute/3', in no set order, and one that raises
%% is detached. Compiled in the test profile only (test/erlang): the real library ships on
%% hex.pm, which the build machines cannot reach. Handlers are kept in a persistent term,
%% so no process has to run for them; tests attach from one process at a time.
-module(telemetry).

-export([attach/4, attach_many/4, detach/1, execute/3, list_handlers/1]).

-define(KEY, {?MODULE, handlers}).

attach(Id, Event, Fun, Config) ->
    attach_many(Id, [Event], Fun, Config).

attach_many(Id, Events, Fun, Config) when is_list(Events), is_function(Fun, 4) ->
    Handlers = handlers(),
    case lists:keymember(Id, 1, Handlers) of
        true -> {error, already_exists};
        false -> persistent_term:put(?KEY, Handlers ++ [{Id, Events, Fun, Config}])
    end.

detach(Id) ->
    Handlers = handlers(),
    case lists:keymember(Id, 1, Handlers) of
        true -> persistent_term:put(?KEY, lists:keydelete(Id, 1, Handlers));
        false -> {error, not_found}
    end.

execute(Event, Measurements, Metadata) when is_map(Measurements), is_map(Metadata) ->
    lists:foreach(
      fun({Id, Events, Fun, Config}) ->
              case lists:member(Event, Events) of
                  true ->
                      try Fun(Event, Measurements, Metadata, Config)
                      catch _:_ -> detach(Id)
                      end;
                  false ->
                      ok
              end
      end, handlers()).

list_handlers(Prefix) ->
    [#{id => Id, event_name => E, function => Fun, config => Config}
     || {Id, Events, Fun, Config} <- handlers(), E <- Events, lists:prefix(Prefix, E)].

handlers() ->
    persistent_term:get(?KEY, []).
