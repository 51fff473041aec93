%% @private
%% The proxies of launch_sync calls from other nodes that run on this node
%% (erlcuda_remote), by their caller's alias, so that a caller that gave up can reach its
%% proxy even when it never heard of it.
%%
%% A caller that abandons its spawn request (the node answered nothing in time) tells this
%% node's agent, which calls `abandon/1'. The proxy may not have started yet, may be
%% running, or may have ended: `abandon/1' and `enter/1' both insert with
%% `ets:insert_new/2', so whichever comes second learns of the other. A proxy that finds
%% its caller gone takes the mark away and runs nothing; a running proxy is told to take
%% its job back; a mark that no proxy comes for (it had ended) is swept after ?MARK_MS.
%% The table belongs to the application's process and outlives the agent.
-module(erlcuda_proxies).

-export([create/0, enter/1, leave/1, abandon/1, sweep/0]).

-define(TABLE, erlcuda_proxies).
-define(MARK_MS, 60000).

%% @doc The table, created once per start of the application.
-spec create() -> ok.
create() ->
    ?TABLE = ets:new(?TABLE, [set, public, named_table, {write_concurrency, true}]),
    ok.

%% @doc The calling proxy starts for the caller behind `Alias': `false' when that caller
%% gave up already (the mark goes then).
-spec enter(reference()) -> boolean().
enter(Alias) ->
    try ets:insert_new(?TABLE, {Alias, self()}) of
        true -> true;
        false -> ets:delete(?TABLE, Alias), false
    catch
        %% No table (erlcuda stops here): nothing can mark it.
        error:badarg -> true
    end.

%% @doc The calling proxy is done.
-spec leave(reference()) -> ok.
leave(Alias) ->
    _ = catch ets:delete_object(?TABLE, {Alias, self()}),
    ok.

%% @doc The caller behind `Alias' gave up: its proxy, running, is told to take its job
%% back; one that has not started finds the mark.
-spec abandon(reference()) -> ok.
abandon(Alias) ->
    Now = erlang:monotonic_time(millisecond),
    case ets:insert_new(?TABLE, {Alias, abandoned, Now}) of
        true ->
            ok;
        false ->
            _ = [Proxy ! {erlcuda_cancel, Alias}
                 || {_, Proxy} <- ets:lookup(?TABLE, Alias), is_pid(Proxy)],
            ok
    end.

%% @doc Marks older than ?MARK_MS go: their proxies ended before the caller gave up.
-spec sweep() -> non_neg_integer().
sweep() ->
    Before = erlang:monotonic_time(millisecond) - ?MARK_MS,
    ets:select_delete(?TABLE, [{{'_', abandoned, '$1'}, [{'<', '$1', Before}], [true]}]).
