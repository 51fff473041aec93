%% `{node, any}''s choice (erlcuda_cluster:pick/1) on figures written by hand, with the
%% application stopped (so this node offers no device of its own).
-module(erlcuda_cluster_pick_tests).

-include_lib("eunit/include/eunit.hrl").

-define(LOADS, erlcuda_cluster_load).

pick_test_() ->
    {setup,
     fun() ->
             _ = application:stop(erlcuda),
             ok = erlcuda_cluster:create()
     end,
     fun(_) ->
             [ets:delete(T) || T <- [?LOADS, erlcuda_remote]]
     end,
     [fun rate_weighs/0, fun unmeasured/0, fun stale_and_down/0]}.

figure(Node, Depth, Rate, At) ->
    Load = #{devices => 1, depths => [Depth], backend => cpu, status => up,
             max_queue => 1000},
    true = ets:insert(?LOADS, [{Node, maybe_rate(Load, Rate), At}, {{Node, 0}, Depth, 0}]).

maybe_rate(Load, undefined) -> Load;
maybe_rate(Load, Rate) -> Load#{rate => Rate}.

clear() ->
    true = ets:delete_all_objects(?LOADS).

now_ms() ->
    erlang:monotonic_time(millisecond).

%% Found by the cluster benchmark: by depth alone, a node that answers jobs at a tenth of
%% the rate of another got as deep a queue, and its callers waited ten times as long (on
%% 2 cores, `{node, any}' ran at 0.18x one node alone). The expected wait decides.
rate_weighs() ->
    clear(),
    figure(fast, 10, 1000.0, now_ms()),
    figure(slow, 2, 100.0, now_ms()),
    ?assertEqual({fast, 0}, erlcuda_cluster:pick(any)),
    %% a queue eleven times the other's, at ten times the rate, waits longer
    figure(fast, 40, 1000.0, now_ms()),
    ?assertEqual({slow, 0}, erlcuda_cluster:pick(any)),
    %% what this node sent since the figure counts in
    [ok = erlcuda_cluster:sent(slow, 0) || _ <- lists:seq(1, 3)],
    ?assertEqual({fast, 0}, erlcuda_cluster:pick(any)).

%% A node whose rate is not measured yet is taken to be as fast as the fastest measured
%% one, and at least a job a second.
unmeasured() ->
    clear(),
    figure(known, 5, 1000.0, now_ms()),
    figure(new, 3, undefined, now_ms()),
    ?assertEqual({new, 0}, erlcuda_cluster:pick(any)),
    figure(new, 7, undefined, now_ms()),
    ?assertEqual({known, 0}, erlcuda_cluster:pick(any)),
    %% A stalled node (busy, answering nothing) measures near 0, which must not read as
    %% "not measured" and be taken for an average one.
    clear(),
    figure(stalled, 1, 0.01, now_ms()),
    figure(new, 3, undefined, now_ms()),
    ?assertEqual({new, 0}, erlcuda_cluster:pick(any)),
    %% none measured: the shortest queue
    clear(),
    figure(a, 4, undefined, now_ms()),
    figure(b, 2, undefined, now_ms()),
    ?assertEqual({b, 0}, erlcuda_cluster:pick(any)).

stale_and_down() ->
    %% the row of this node's rate in the same table is no node
    clear(),
    true = ets:insert(?LOADS, {local_rate, 5.0}),
    figure(fast, 0, 1000.0, now_ms()),
    ?assertNot(erlcuda_cluster:is_member(local_rate)),
    ?assert(erlcuda_cluster:is_member(fast)),
    ?assertNot(erlcuda_cluster:is_member(elsewhere)),
    clear(),
    figure(old, 0, 1000.0, now_ms() - 5000),
    figure(busy, 50, 1000.0, now_ms()),
    ?assertEqual({busy, 0}, erlcuda_cluster:pick(any)),
    clear(),
    figure(old, 0, 1000.0, now_ms() - 5000),
    ?assertEqual(none, erlcuda_cluster:pick(any)).
