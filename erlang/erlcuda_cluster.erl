%% @private
%% The cluster agent: one per node, a member of group `erlcuda' in erlcuda's own pg scope
%% (`erlcuda_pg'), so the nodes that run erlcuda find each other as they connect and
%% disconnect, with no configuration.
%%
%% Load: every ?TICK_MS (and at once when this node's worker changes status or device
%% count) the agent sends its node's figure, `{erlcuda_load, Node, #{devices, depths,
%% backend, status, max_queue, rate}}', to every other member (rate: the jobs it answers
%% a second while busy). Receivers keep the figures in a public table that callers read
%% without a process hop:
%%   `{Node, Load, ReceivedAt}'            one row per node of the cluster (its membership)
%%   `{local_rate, JobsPerSecond}'         this node's rate, as the agent measures it
%%   `{{Node, Device}, Depth, Sent}'       the published depth, and what this node sent
%%                                         there since (so a burst of `{node, any}'
%%                                         launches does not all go to one stale minimum)
%% A node whose agent leaves the group, or whose connection drops, is removed at once.
%%
%% Remote jobs (erlcuda_remote): the agent watches the proxies of this node's launch jobs
%% on other nodes (each tells it `{erlcuda_proxy, JobId, Pid}' as it starts), and their
%% 'DOWN' ends the job's record; a proxy lost with its connection, and on a nodedown every
%% job recorded for that node, is answered `{error, {node_down, Node}}' through the job's
%% one-shot alias. A proxy whose result names buffers hands it to the agent
%% (`{erlcuda_held, JobId, Proxy, Message}'), which holds it in the record and tells the
%% proxy to give the buffers to the caller; the proxy's normal end then delivers it.
-module(erlcuda_cluster).
-behaviour(gen_server).

-export([create/0, start_link/0, is_member/1, pick/1, sent/2, info/0, local_load/0,
         nodes_up/0]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-export_type([load/0]).

-define(SCOPE, erlcuda_pg).
-define(GROUP, erlcuda).
-define(LOADS, erlcuda_cluster_load).
-define(TICK_MS, 200).
%% `{node, any}' passes over a node whose last figure is older than this (five ticks).
-define(STALE_MS, 1000).
%% This node's rate, in the table of figures: `{?LOCAL_RATE, JobsPerSecond}' (a pair,
%% which no pattern for figures' rows matches).
-define(LOCAL_RATE, local_rate).
%% The weight of each new measure of the rate.
-define(RATE_ALPHA, 0.3).
%% The least rate a busy node is measured at (jobs a second).
-define(MIN_RATE, 0.01).
%% After this many ticks without a job in flight, the rate is not known any more.
-define(IDLE_TICKS, 5).

-type load() :: #{devices := non_neg_integer(), depths := [integer()],
                  backend := cpu | cuda | undefined,
                  status := up | {down, term()} | {unavailable, binary()} | unknown,
                  max_queue => pos_integer(), rate => float()}.

-record(state, {ref :: reference(),
                members = #{} :: #{pid() => node()},
                ticks = 0 :: non_neg_integer(),
                %% the worker generation whose backend is known, and whether one is asked
                epoch = 0 :: non_neg_integer(),
                asking = false :: boolean(),
                %% the proxies of this node's launch jobs on other nodes, by monitor
                proxies = #{} :: #{reference() => erlcuda:job_id()},
                %% jobs answered by the last tick, when, and whether some were in flight
                done = 0 :: non_neg_integer(),
                done_at = 0 :: integer(),
                busy = false :: boolean(),
                idle = 0 :: non_neg_integer()}).

%% @doc The table of figures; created by the application's process so that it outlives
%% the agent. The table of remote jobs' records too (erlcuda_records).
-spec create() -> ok.
create() ->
    ?LOADS = ets:new(?LOADS, [set, public, named_table, {read_concurrency, true},
                              {write_concurrency, true}]),
    erlcuda_records:create().

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Whether `Node' is a node of the cluster (runs erlcuda, is connected, not excluded).
-spec is_member(node()) -> boolean().
is_member(Node) ->
    %% Reads only the figure's time, not the figure, on every remote launch; the row of
    %% this node's rate has no third element.
    try ets:lookup_element(?LOADS, Node, 3) of
        At -> is_integer(At)
    catch error:badarg -> false
    end.

%% @doc The nodes of the cluster besides this one, with their figures.
-spec nodes_up() -> [node()].
nodes_up() ->
    try ets:select(?LOADS, [{{'$1', '_', '_'}, [{is_atom, '$1'}], ['$1']}])
    catch error:badarg -> []
    end.

%% @doc The `{Node, Device}' of the cluster with the least expected wait for a
%% `{node, any}' launch that asks for `Want' (`any': any device; N: device N of a node
%% that has it), this node included: (depth + 1) / rate, where a node's depths are exact
%% for this one, the others' published plus what this node sent there since, and its rate
%% is the jobs it answers a second while busy, shared by its devices. `cluster_exclude' nodes are never chosen, nor nodes whose last figure is more
%% than ?STALE_MS old; `cluster_prefer' nodes are chosen while one of their devices has
%% room. `none' when no node is up.
-spec pick(erlcuda:device()) -> {node(), non_neg_integer()} | none.
pick(Want) ->
    Exclude = env(cluster_exclude),
    Rows = try ets:tab2list(?LOADS) catch error:badarg -> [] end,
    %% A node whose figure is late (its agent or the connection to it is busy) is not
    %% chosen until one comes.
    Fresh = now_ms() - ?STALE_MS,
    Loads = maps:from_list([{N, L} || {N, L, At} <- Rows, is_atom(N), At >= Fresh]),
    LocalRate = case lists:keyfind(?LOCAL_RATE, 1, Rows) of
                    {_, R} -> R;
                    false -> 0.0
                end,
    Local = case lists:member(node(), Exclude) of
                true -> [];
                false -> local_candidates(Want, LocalRate)
            end,
    Remote = [{N, D, Depth + Sent, max_queue(L), device_rate(L)}
              || {{N, D}, Depth, Sent} <- Rows, #{status := up} = L <- [maps:get(N, Loads, #{})],
                 Want =:= any orelse Want =:= D, not lists:member(N, Exclude)],
    All = with_rates(Local ++ Remote),
    Candidates = case env(cluster_prefer) of
                     [] -> All;
                     Prefer ->
                         case [C || {N, _, Depth, Max, _} = C <- All, Depth < Max,
                                    lists:member(N, Prefer)] of
                             [] -> All;
                             Preferred -> Preferred
                         end
                 end,
    least(Candidates).

%% @doc Count a job sent to `Device' of `Node' into that device's estimate.
-spec sent(node(), non_neg_integer()) -> ok.
sent(Node, Device) ->
    try ets:update_counter(?LOADS, {Node, Device}, {3, 1}) of
        _ -> ok
    catch error:badarg -> ok
    end.

%% @doc Every node of the cluster, this one included: its devices, their queue depths, the
%% backend, the worker's status, the jobs it answers a second while busy (0.0 until
%% measured) and the age of the figure in milliseconds.
-spec info() -> #{node() => #{devices := non_neg_integer(), depths := [integer()],
                              backend := cpu | cuda | undefined, status := term(),
                              age_ms := non_neg_integer(), rate => float()}}.
info() ->
    Now = now_ms(),
    Rows = try ets:tab2list(?LOADS) catch error:badarg -> [] end,
    Remote = maps:from_list(
               [{N, (maps:with([devices, depths, backend, status, rate], L))#{age_ms => Now - At}}
                || {N, L, At} <- Rows, is_atom(N)]),
    Remote#{node() => (maps:with([devices, depths, backend, status, rate], local_load()))#{
                         age_ms => 0}}.

%% @doc This node's figure.
-spec local_load() -> load().
local_load() ->
    Backend = persistent_term:get({?MODULE, backend}, undefined),
    case erlcuda_status:status() of
        #{status := up, devices := N, queues := Q, max_queue := Max} ->
            #{devices => N, depths => [erlcuda_status:in_flight(Q, I) || I <- seq(N)],
              backend => Backend, status => up, max_queue => Max, rate => local_rate()};
        #{status := Status} ->
            #{devices => 0, depths => [], backend => Backend, status => Status}
    end.

%% gen_server.

-spec init([]) -> {ok, #state{}}.
init([]) ->
    ok = net_kernel:monitor_nodes(true),
    ok = pg:join(?SCOPE, ?GROUP, self()),
    {Ref, Pids} = pg:monitor(?SCOPE, ?GROUP),
    Members = maps:from_list([{P, node(P)} || P <- Pids, node(P) =/= node()]),
    %% A restarted agent: figures of nodes that left meanwhile go, and jobs recorded for
    %% nodes no longer connected are answered now (their nodedown came to nobody).
    Known = lists:usort(maps:values(Members)),
    _ = [forget(N) || N <- nodes_up(), not lists:member(N, Known)],
    Connected = nodes(),
    _ = [erlcuda_records:node_down(N) || N <- erlcuda_records:recorded_nodes(),
                                        not lists:member(N, Connected)],
    %% and the proxies a predecessor watched are watched again.
    State = lists:foldl(fun({Id, Proxy}, S) -> watch(Id, Proxy, S) end,
                        #state{ref = Ref, members = Members}, erlcuda_records:watched()),
    _ = [welcome(P, N) || {P, N} <- maps:to_list(Members)],
    self() ! tick,
    {ok, State}.

-spec handle_call(term(), gen_server:from(), #state{}) ->
    {reply, {error, unknown_call}, #state{}}.
handle_call(_, _, State) ->
    {reply, {error, unknown_call}, State}.

-spec handle_cast(term(), #state{}) -> {noreply, #state{}}.
handle_cast(_, State) ->
    {noreply, State}.

-spec handle_info(term(), #state{}) -> {noreply, #state{}}.
handle_info(tick, #state{ticks = T} = State0) ->
    erlang:send_after(?TICK_MS, self(), tick),
    State = measure(status_change(State0)),
    publish(State),
    purge_excluded(),
    {noreply, State#state{ticks = T + 1}};
handle_info({erlcuda_cluster, status}, State0) ->
    %% The worker's status or device count changed: tell the others now.
    State = status_change(State0),
    publish(State),
    {noreply, State};
handle_info({erlcuda_load, Node, Load}, #state{members = Members} = State) ->
    case is_map(Load) andalso lists:member(Node, maps:values(Members))
        andalso not lists:member(Node, env(cluster_exclude)) of
        true -> store(Node, Load);
        false -> ok
    end,
    {noreply, State};
handle_info({Ref, join, ?GROUP, Pids}, #state{ref = Ref, members = Members} = State) ->
    New = [{P, node(P)} || P <- Pids, node(P) =/= node()],
    _ = [welcome(P, N) || {P, N} <- New],
    {noreply, State#state{members = maps:merge(Members, maps:from_list(New))}};
handle_info({Ref, leave, ?GROUP, Pids}, #state{ref = Ref, members = Members} = State) ->
    Rest = maps:without(Pids, Members),
    Left = lists:usort([node(P) || P <- Pids]) -- maps:values(Rest),
    _ = [forget(N) || N <- Left],
    {noreply, State#state{members = Rest}};
handle_info({nodedown, Node}, #state{members = Members} = State) ->
    %% The figures go first: a caller that records a job after this finds the node gone
    %% and takes its record back itself (erlcuda_remote).
    forget(Node),
    ok = erlcuda_records:node_down(Node),
    {noreply, State#state{members = maps:filter(fun(_, N) -> N =/= Node end, Members)}};
handle_info({erlcuda_proxy, Id, Proxy}, State) when is_integer(Id), is_pid(Proxy) ->
    %% Told whether or not its job is still recorded (one answered node_down is not), so
    %% that it stops telling.
    State1 = watch(Id, Proxy, State),
    Proxy ! {erlcuda_watched, Id},
    {noreply, State1};
handle_info({erlcuda_held, Id, Proxy, Message}, State) when is_integer(Id), is_pid(Proxy),
                                                            is_tuple(Message) ->
    %% A result that names buffers: taken into the job's record, and delivered once its
    %% proxy has given the buffers to the caller and ended ('DOWN', normal). A job already
    %% answered (node_down) refuses it, and its proxy frees them.
    {Answer, State1} = case erlcuda_records:hold(Proxy, Id, Message) of
                           held -> {{erlcuda_taken, Id}, State};
                           unwatched -> {{erlcuda_taken, Id}, watch(Id, Proxy, State)};
                           answered -> {{erlcuda_cancel, Id}, State};
                           %% A launch of before erlcuda restarted here: taken, and
                           %% answered by its proxy alone.
                           unknown -> {{erlcuda_taken, Id}, State}
                       end,
    Proxy ! Answer,
    {noreply, State1};
handle_info({'DOWN', Mon, process, Proxy, Why}, #state{proxies = Proxies} = State) ->
    case maps:take(Mon, Proxies) of
        {Id, Rest} ->
            ok = erlcuda_records:proxy_down(node(Proxy), Id, Why),
            {noreply, State#state{proxies = Rest}};
        error ->
            {noreply, State}
    end;
handle_info({backend, Epoch, Backend}, State) when Backend =:= cpu; Backend =:= cuda ->
    case persistent_term:get({?MODULE, backend}, undefined) of
        Backend -> ok;
        _ -> persistent_term:put({?MODULE, backend}, Backend)
    end,
    publish(State),
    {noreply, State#state{epoch = Epoch, asking = false}};
handle_info({backend, _, _}, State) ->
    %% Not known yet (the worker has not said hello): asked again at the next tick.
    {noreply, State#state{asking = false}};
handle_info(_, State) ->
    {noreply, State}.

%% Internal.


%% A new member: a row at once (its figure follows), and this node's figure to it now.
welcome(Pid, Node) ->
    case lists:member(Node, env(cluster_exclude)) orelse is_member(Node) of
        true -> ok;
        false -> true = ets:insert(?LOADS, {Node, #{devices => 0, depths => [],
                                                    backend => undefined,
                                                    status => unknown}, now_ms()})
    end,
    _ = send(Pid, {erlcuda_load, node(), local_load()}),
    ok.

forget(Node) ->
    ets:match_delete(?LOADS, {Node, '_', '_'}),
    ets:match_delete(?LOADS, {{Node, '_'}, '_', '_'}).

store(Node, #{devices := N, depths := Depths} = Load) when is_integer(N), is_list(Depths) ->
    Rows = [{{Node, D}, Depth, 0} || {D, Depth} <- lists:zip(seq(length(Depths)), Depths),
                                     is_integer(Depth)],
    %% Devices the node no longer has go.
    ets:select_delete(?LOADS, [{{{Node, '$1'}, '_', '_'}, [{'>=', '$1', length(Rows)}],
                                [true]}]),
    true = ets:insert(?LOADS, [{Node, Load, now_ms()} | Rows]),
    ok;
store(_, _) ->
    ok.

publish(#state{members = Members}) when map_size(Members) =:= 0 ->
    ok;
publish(#state{members = Members}) ->
    Message = {erlcuda_load, node(), local_load()},
    maps:foreach(fun(Pid, _) -> _ = send(Pid, Message) end, Members).

%% Never suspended on a busy connection, never connecting: whether it was sent.
send(Pid, Message) ->
    erlang:send(Pid, Message, [nosuspend, noconnect]) =:= ok.

%% A new worker: learn its backend (from its hello) without waiting on it here.
status_change(#state{asking = true} = State) ->
    State;
status_change(#state{epoch = Known} = State) ->
    case erlcuda_status:status() of
        #{status := up, epoch := Epoch} when Epoch =/= Known ->
            Agent = self(),
            _ = spawn(fun() ->
                              B = case catch erlcuda_worker:info() of
                                      #{backend := Backend} -> Backend;
                                      _ -> undefined
                                  end,
                              Agent ! {backend, Epoch, B}
                      end),
            State#state{asking = true};
        _ ->
            State
    end.

%% This node's rate: jobs answered a second, measured only over ticks with jobs in flight
%% at both ends (an idle node's rate says how much it was given, not what it can do), and
%% smoothed.
measure(#state{done = Done0, done_at = At0, busy = Busy0, idle = Idle0} = State) ->
    Done = erlcuda_jobs:answered(),
    Now = now_ms(),
    Busy = lists:sum(maps:get(depths, local_load(), [])) > 0,
    Idle = case Busy0 orelse Busy of
               true -> 0;
               false -> Idle0 + 1
           end,
    if
        Busy0, Busy, Now > At0 ->
            Seen = (Done - Done0) * 1000 / (Now - At0),
            Rate = case local_rate() of
                       Old when Old > 0 -> Old + ?RATE_ALPHA * (Seen - Old);
                       _ -> Seen
                   end,
            %% Busy and answering nothing (a stalled device) is slow, not unmeasured.
            true = ets:insert(?LOADS, {?LOCAL_RATE, max(?MIN_RATE, float(Rate))});
        Idle =:= ?IDLE_TICKS ->
            %% Idle a while: the rate was of other jobs, maybe, and a low one would keep
            %% work from coming here to measure it again.
            true = ets:delete(?LOADS, ?LOCAL_RATE);
        true ->
            ok
    end,
    State#state{done = Done, done_at = Now, busy = Busy, idle = Idle}.

local_rate() ->
    try ets:lookup(?LOADS, ?LOCAL_RATE) of
        [{_, Rate}] -> Rate;
        [] -> 0.0
    catch error:badarg -> 0.0
    end.

purge_excluded() ->
    case env(cluster_exclude) of
        [] -> ok;
        Exclude -> _ = [forget(N) || N <- Exclude, N =/= node(), is_member(N)], ok
    end.

%% A proxy of this node's launch job `Id' runs: watched while its job is recorded (one
%% answered already, by a nodedown, is not).
watch(Id, Proxy, #state{proxies = Proxies} = State) ->
    case erlcuda_records:watch(Proxy, Id) of
        true -> State#state{proxies = Proxies#{monitor(process, Proxy) => Id}};
        false -> State
    end.

local_candidates(Want, Rate) ->
    case erlcuda_status:status() of
        #{status := up, devices := N, queues := Q, max_queue := Max} when N > 0 ->
            [{node(), D, erlcuda_status:in_flight(Q, D), Max, Rate / N}
             || D <- seq(N), Want =:= any orelse Want =:= D];
        _ ->
            []
    end.

%% A device's rate: its node's, shared by its devices; 0.0 while not measured.
device_rate(#{rate := Rate, devices := N}) when is_float(Rate), Rate > 0, is_integer(N),
                                               N > 0 ->
    Rate / N;
device_rate(_) ->
    0.0.

%% A device whose rate is not measured yet is taken to be as fast as the fastest of those
%% that are, and at least a job a second: so it is tried, and measured, before a slow or
%% stalled one (as fast as each other when none is measured).
with_rates(Candidates) ->
    Default = lists:max([1.0 | [R || {_, _, _, _, R} <- Candidates, R > 0]]),
    [case C of
         {N, D, Depth, Max, R} when R == 0 -> {N, D, Depth, Max, Default};
         _ -> C
     end || C <- Candidates].

max_queue(#{max_queue := Max}) when is_integer(Max) -> Max;
max_queue(_) -> 10000.

%% The least expected wait, (depth + 1) / rate: a device that runs jobs twice as fast
%% takes twice the queue. Ties broken at random, so equal devices share a burst.
least([]) ->
    none;
least([{N, D, _, _, _} = C | Rest]) ->
    least(Rest, {N, D}, wait(C), 1).

least([], Best, _, _) ->
    Best;
least([{N, D, _, _, _} = C | Rest], Best, BestWait, Ties) ->
    case wait(C) of
        W when W < BestWait -> least(Rest, {N, D}, W, 1);
        W when W == BestWait ->
            case rand:uniform(Ties + 1) of
                1 -> least(Rest, {N, D}, W, Ties + 1);
                _ -> least(Rest, Best, W, Ties + 1)
            end;
        _ -> least(Rest, Best, BestWait, Ties)
    end.

wait({_, _, Depth, _, Rate}) ->
    (Depth + 1) / Rate.

env(Key) ->
    case application:get_env(erlcuda, Key, []) of
        L when is_list(L) -> [N || N <- L, is_atom(N)];
        _ -> []
    end.

seq(0) -> [];
seq(N) -> lists:seq(0, N - 1).

now_ms() ->
    erlang:monotonic_time(millisecond).
