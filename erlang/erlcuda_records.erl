%% @private
%% This node's records of its launch jobs in flight on other nodes (erlcuda_remote): an
%% ETS table of `{{Node, JobId}, Alias, Proxy, Traced, Held, Caller}', Proxy `undefined'
%% until the job's proxy is heard of, then its pid; Traced whether its reply carries
%% stamps; Held `none', or a result naming buffers that waits for its proxy to give them to
%% the caller and end; Caller the process that launched it. A caller records its job before its proxy is spawned; the agent
%% (erlcuda_cluster) watches the proxy and answers through the alias when it is lost. A
%% record goes with whoever takes it: the agent when the proxy ends or its node goes down,
%% or the caller whose proxy could not be spawned.
-module(erlcuda_records).

-export([create/0, record/3, take_back/1, watch/2, hold/3, watched/0, proxy_down/3,
         node_down/1, recorded_nodes/0, lost/2, error_message/3, find/1, take/1]).

-define(RECORDS, erlcuda_remote).
%% The first job id of this table's life: the jobs launched before it (erlcuda restarted
%% since) have no record here.
-define(FIRST_ID, persistent_term:get({?MODULE, first_id}, 0)).

%% @doc The table of this node's launch jobs in flight on other nodes; created by the
%% application's process so that it outlives the agent.
-spec create() -> ok.
create() ->
    ?RECORDS = ets:new(?RECORDS, [ordered_set, public, named_table,
                                  {write_concurrency, true}]),
    persistent_term:put({?MODULE, first_id}, erlcuda_jobs:next_id()),
    ok.

%% @doc A caller's launch job `Key' on another node, replying through `Alias' (with stamps
%% when `Traced').
-spec record({node(), erlcuda:job_id()}, reference(), boolean()) -> ok.
record(Key, Alias, Traced) ->
    true = ets:insert(?RECORDS, {Key, Alias, undefined, Traced, none, self()}),
    ok.

%% @doc The record of the calling process's launch job `Id' on another node: its key and
%% alias; `none' when there is none.
-spec find(erlcuda:job_id()) -> {{node(), erlcuda:job_id()}, reference()} | none.
find(Id) ->
    case ets:select(?RECORDS, [{{{'$1', Id}, '$2', '_', '_', '_', self()}, [],
                                [{{{{'$1', Id}}, '$2'}}]}]) of
        [Found | _] -> Found;
        [] -> none
    end.

%% @doc The caller takes its record back as it stops waiting for the job (erlcuda:await/2):
%% the job's proxy and what the record held; `answered' when the agent took it first.
-spec take({node(), erlcuda:job_id()}) -> {pid() | undefined, tuple() | none} | answered.
take(Key) ->
    case ets:take(?RECORDS, Key) of
        [{_, _, Proxy, _, Held, _}] -> {Proxy, Held};
        [] -> answered
    end.

%% @doc The caller takes its record back (its proxy could not be spawned): `false' when the
%% agent took it first (and answered the job).
-spec take_back({node(), erlcuda:job_id()}) -> boolean().
take_back(Key) ->
    ets:take(?RECORDS, Key) =/= [].

%% @doc The proxy `Proxy' of this node's launch job `Id' runs: its record keeps it, and
%% the agent monitors it. `false' when the job is answered already (its node went down).
-spec watch(pid(), erlcuda:job_id()) -> boolean().
watch(Proxy, Id) ->
    try ets:update_element(?RECORDS, {node(Proxy), Id}, {3, Proxy})
    catch error:badarg -> false
    end.

%% @doc The watched proxy `Proxy' of this node's launch job `Id' has a result that names
%% buffers: the record holds it until the proxy ends (`held'; told again by a proxy whose
%% agent restarted, it holds it again). `answered' when the job is answered already (its
%% node went down), or is not that proxy's; `unknown' for a job launched before this
%% table was made (erlcuda restarted here since), which nobody here answers.
-spec hold(pid(), erlcuda:job_id(), tuple()) -> held | unwatched | answered | unknown.
hold(Proxy, Id, Message) ->
    Key = {node(Proxy), Id},
    case ets:lookup(?RECORDS, Key) of
        [{Key, _, Proxy, _, _, _}] ->
            case ets:update_element(?RECORDS, Key, {5, Message}) of
                true -> held;
                false -> answered
            end;
        [{Key, _, undefined, _, _, _}] ->
            %% Its proxy was not heard of yet (an agent that restarted before it was):
            %% held, and the agent watches it now.
            case ets:update_element(?RECORDS, Key, [{3, Proxy}, {5, Message}]) of
                true -> unwatched;
                false -> answered
            end;
        [_] -> answered;
        [] -> case Id < ?FIRST_ID of
                  true -> unknown;
                  false -> answered
              end
    end.

%% @doc A watched proxy of this node's launch job `Id' ended: its record goes. A normal end
%% came after its reply (sent on the same connection) or after it gave the buffers of the
%% result the record holds, which is delivered now. One that ended for `noconnection' is
%% the job's `node_down'; any other end gets the job an error.
-spec proxy_down(node(), erlcuda:job_id(), term()) -> ok.
proxy_down(Node, Id, Why) ->
    case ets:take(?RECORDS, {Node, Id}) of
        [{_, _, _, _, none, _}] when Why =:= normal -> ok;
        [{_, Alias, _, _, Held, _}] when Why =:= normal; Why =:= noproc ->
            %% A held result was taken: the proxy gave its buffers and ended (an agent
            %% that restarted meanwhile finds it gone, noproc).
            Alias ! Held, ok;
        [{_, Alias, _, Traced, _, _}] -> Alias ! error_message(Id, lost(Node, Why), Traced), ok;
        [] -> ok
    end.

%% @doc This node's launch jobs whose proxy is known, `{Id, Proxy}': an agent that restarted
%% watches them again.
-spec watched() -> [{erlcuda:job_id(), pid()}].
watched() ->
    ets:select(?RECORDS, [{{{'_', '$1'}, '_', '$2', '_', '_', '_'}, [{is_pid, '$2'}],
                           [{{'$1', '$2'}}]}]).

%% @doc `Node' went down: every job recorded for it is answered `{error, {node_down,
%% Node}}', through its alias.
-spec node_down(node()) -> ok.
node_down(Node) ->
    Keys = ets:select(?RECORDS, [{{{Node, '_'}, '_', '_', '_', '_', '_'}, [],
                                  [{element, 1, '$_'}]}]),
    lists:foreach(fun(Key) -> proxy_down(Node, element(2, Key), noconnection) end, Keys).

%% @doc The nodes this node has jobs recorded for.
-spec recorded_nodes() -> [node()].
recorded_nodes() ->
    try recorded(ets:first(?RECORDS), [])
    catch error:badarg -> []
    end.

%% Keys are {Node, Id}, Id an integer: {Node, []} sorts after every key of Node.
recorded('$end_of_table', Acc) -> lists:reverse(Acc);
recorded({Node, _}, Acc) -> recorded(ets:next(?RECORDS, {Node, []}), [Node | Acc]).

%% @doc A proxy that ended without a reply: its node, or its connection, was lost (or the
%% connection did not carry the hand-over of its result in time: `{shutdown, unanswered}').
-spec lost(node(), term()) -> {error, erlcuda:reason()}.
lost(Node, noconnection) -> {error, {node_down, Node}};
lost(Node, {shutdown, unanswered}) -> {error, {node_down, Node}};
lost(_, Why) -> {error, {internal, iolist_to_binary(io_lib:format("the job's proxy on its "
                                                                  "node ended: ~0P",
                                                                  [Why, 10]))}}.


%% @doc The reply of a remote job answered with an error away from its worker: with stamps
%% when the job is traced, none (no stage ran), as a local job's.
-spec error_message(erlcuda:job_id() | reference(), {error, erlcuda:reason()}, boolean()) ->
    tuple().
error_message(Tag, Error, true) ->
    {erlcuda, Tag, Error, #{}};
error_message(Tag, Error, false) ->
    {erlcuda, Tag, Error}.
