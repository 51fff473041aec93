%% @private
%% Jobs on other nodes of the cluster, and buffers that live there.
%%
%% A launch with `{node, Node | any}' (or with buffers of another node of the cluster) is
%% sent straight to the executing node: the caller spawns a short-lived submitter there
%% (`execute/7', spawn_request without a reply), which runs the same validate and submit as
%% a local caller does, so the operands travel over distribution once and no process of
%% the caller's node relays them. The job id is this node's (erlcuda_jobs:next_id/0), so
%% it never collides with the caller's local jobs; the executing node registers the job
%% under an id of its own, with this one to reply with, and its port owner sends the result
%% straight to the caller: one message over distribution.
%%
%% Exactly one reply: the job replies to an alias made with `alias([reply])', which the
%% runtime deactivates at the first message received through it. Before the job leaves,
%% the caller records `{{Node, JobId}, Alias, Mark}' here; on a nodedown the agent
%% (erlcuda_cluster) answers every job recorded for that node `{error, {node_down, Node}}'
%% through the same alias. Whichever of the result and node_down comes first is the reply;
%% the runtime drops the other, so a late result (after a reconnect, say) never reaches
%% the caller.
%%
%% A record is taken out by whoever answers through it (the agent, with `ets:take/2'), by
%% `launch_sync' once its reply came, or by the reconciliation: every two seconds or so
%% the agent asks each node which of this node's jobs it has finished since (answered, or
%% refused by its submitter), and those records are dropped (`reconcile/2'). Only a job
%% the other node reports finished goes: one still on its way there, or not yet
%% registered, keeps its record, so a node_down can still reach it. The table stays
%% bounded without a message per job.
%%
%% launch_sync's timeout: a job that was to keep buffers is taken back on its node
%% (`cancel_here/2'). One not registered there yet is either answered (its reply is on the
%% way: wait for it and free what it kept) or not come yet: then a tombstone makes its
%% submitter submit nothing, and the caller goes at once. To tell the two apart, the
%% executing node keeps a claim for each launch_sync job of another node from its
%% submitter's start until the caller has acknowledged the answer that reported it
%% finished; by then the caller's record of it is gone, so a caller that still has its
%% record and finds no claim knows the job never came.
-module(erlcuda_remote).

-export([create/0, node_option/1, launch/5, follow/5, execute/7, node_down/1, recorded_nodes/0,
         reconcile/2, finished/3, report/2, unreport/3, acked/2, cancel_here/2, sweep/0,
         forget_finished/1, remote_node/1, free/2, give/3, buffer_info/2, without_node/1]).

-define(RECORDS, erlcuda_remote).
%% On the executing node: `{CallerNode, ReplyId, Sync}' of the jobs of other nodes it
%% finished since that node last asked.
-define(FINISHED, erlcuda_remote_finished).
%% On the executing node, for the launch_sync jobs of other nodes (the ones a caller may
%% cancel): `{{CallerNode, ReplyId}, State}', State `submitting' while its submitter
%% checks it, `registering', then `submitted'; or `{cancelled, Since}' when the caller
%% gave up before the submitter registered it (a tombstone: the submitter finds it and
%% submits nothing). A
%% submitted row stays until the caller has taken in that the job is finished (below), so
%% a row that is missing means "never came" to whoever's record of the job is still there.
-define(CLAIMS, erlcuda_remote_claims).
%% On the executing node: `{{CallerNode, Ref}, SyncIds, Since}', the launch_sync jobs
%% reported finished in answer `Ref', whose claims go when the caller acknowledges it.
-define(REPORTED, erlcuda_remote_reported).
%% Tombstones and unacknowledged reports older than this go (a submitter that never came,
%% an agent that restarted before it acknowledged).
-define(CLAIM_TTL_MS, 60000).
%% How long cancel_here/2 waits for a submitter between its claim and its registration.
-define(CLAIM_WAITS, 1000).
%% What `receive ... after' accepts.
-define(MAX_TIMEOUT, 4294967295).
%% Calls to another node about buffers, and the wait for a kept result after a timeout.
-define(CALL_TIMEOUT, 5000).

%% How many times `{node, any}' chooses again when the node it chose left meanwhile.
-define(REPICKS, 3).

-type mode() :: async | sync.

%% @doc The table of this node's jobs in flight on other nodes; created by the
%% application's process so that it outlives the agent.
-spec create() -> ok.
create() ->
    ?RECORDS = ets:new(?RECORDS, [ordered_set, public, named_table,
                                  {write_concurrency, true}]),
    ?FINISHED = ets:new(?FINISHED, [duplicate_bag, public, named_table,
                                    {write_concurrency, true}]),
    ?CLAIMS = ets:new(?CLAIMS, [set, public, named_table, {write_concurrency, true}]),
    ?REPORTED = ets:new(?REPORTED, [set, public, named_table]),
    ok.

%% @doc On the executing node: the job `ReplyId' of `CallerNode' is answered (or was
%% refused), so its caller may drop its record.
-spec finished(node(), erlcuda:job_id(), boolean()) -> ok.
finished(CallerNode, ReplyId, Sync) ->
    try ets:insert(?FINISHED, {CallerNode, ReplyId, Sync}) of
        true -> ok
    catch error:badarg -> ok
    end.

%% @doc The ids of `CallerNode''s jobs finished here since the last call, reported in the
%% answer `Ref'; the claims of the launch_sync ones stay until `Ref' is acknowledged.
-spec report(node(), reference()) -> [{node(), erlcuda:job_id(), boolean()}].
report(CallerNode, Ref) ->
    try ets:take(?FINISHED, CallerNode) of
        Rows ->
            case [Id || {_, Id, true} <- Rows] of
                [] -> ok;
                Sync -> true = ets:insert(?REPORTED, {{CallerNode, Ref}, Sync, now_ms()})
            end,
            Rows
    catch error:badarg -> []
    end.

%% @doc The answer `Ref' could not be sent: its jobs are reported next time.
-spec unreport(node(), reference(), [{node(), erlcuda:job_id(), boolean()}]) -> ok.
unreport(CallerNode, Ref, Rows) ->
    try
        true = ets:delete(?REPORTED, {CallerNode, Ref}),
        true = ets:insert(?FINISHED, Rows),
        ok
    catch error:badarg -> ok
    end.

%% @doc `CallerNode' took in the answers `Refs': the claims of the jobs in them go.
-spec acked(node(), [reference()]) -> ok.
acked(CallerNode, Refs) ->
    lists:foreach(fun(Ref) ->
                          case catch ets:take(?REPORTED, {CallerNode, Ref}) of
                              [{_, Ids, _}] -> drop_claims(CallerNode, Ids);
                              _ -> ok
                          end
                  end, Refs).

drop_claims(CallerNode, Ids) ->
    lists:foreach(fun(Id) -> ets:delete(?CLAIMS, {CallerNode, Id}) end, Ids).

%% @doc Tombstones and reports older than a minute go.
-spec sweep() -> ok.
sweep() ->
    Old = now_ms() - ?CLAIM_TTL_MS,
    try
        _ = ets:select_delete(?CLAIMS, [{{'_', {cancelled, '$1'}}, [{'<', '$1', Old}], [true]}]),
        Stale = ets:select(?REPORTED, [{{'$1', '$2', '$3'}, [{'<', '$3', Old}],
                                        [{{'$1', '$2'}}]}]),
        lists:foreach(fun({{CallerNode, _} = Key, Ids}) ->
                              ets:delete(?REPORTED, Key),
                              drop_claims(CallerNode, Ids)
                      end, Stale)
    catch error:badarg -> ok
    end.

%% @doc `CallerNode' went down: nobody will ask for its finished jobs, nor cancel one.
-spec forget_finished(node()) -> ok.
forget_finished(CallerNode) ->
    _ = (catch ets:delete(?FINISHED, CallerNode)),
    _ = (catch ets:match_delete(?CLAIMS, {{CallerNode, '_'}, '_'})),
    _ = (catch ets:match_delete(?REPORTED, {{CallerNode, '_'}, '_', '_'})),
    ok.

%% @doc On the executing node, for a caller of `CallerNode' whose launch_sync of job
%% `ReplyId' timed out: the job is taken back if registered (`cancelled'); `answered' when
%% it was answered already (its reply is on the way); `pending' when its submitter has not
%% come yet: a tombstone makes it submit nothing; `unknown' when its submitter did not
%% register it in time.
-spec cancel_here(node(), erlcuda:job_id()) -> cancelled | answered | pending | unknown.
cancel_here(CallerNode, ReplyId) ->
    cancel_here(CallerNode, ReplyId, ?CLAIM_WAITS).

cancel_here(CallerNode, ReplyId, Waits) ->
    Key = {CallerNode, ReplyId},
    case erlcuda_jobs:cancel_remote(CallerNode, ReplyId) of
        absent ->
            case ets:lookup(?CLAIMS, Key) of
                %% Registered once: answered, unless it was registered just after the
                %% first look.
                [{_, submitted}] ->
                    case erlcuda_jobs:cancel_remote(CallerNode, ReplyId) of
                        absent -> answered;
                        Done -> Done
                    end;
                [{_, {cancelled, _}}] -> pending;
                [{_, State}] when Waits > 0 ->
                    %% Its submitter is checking the launch (it then finds the tombstone),
                    %% or registering it (a moment).
                    Tombstone = {cancelled, now_ms()},
                    case State =:= submitting andalso replace(Key, submitting, Tombstone) of
                        true -> pending;
                        false -> timer:sleep(1), cancel_here(CallerNode, ReplyId, Waits - 1)
                    end;
                [_] -> unknown;
                [] ->
                    case ets:insert_new(?CLAIMS, {Key, {cancelled, now_ms()}}) of
                        true -> pending;
                        %% Its submitter claimed it meanwhile.
                        false when Waits > 0 -> cancel_here(CallerNode, ReplyId, Waits - 1);
                        false -> unknown
                    end
            end;
        Done ->
            Done
    end.

%% The submitter's side: `ok' to check the launch, `cancelled' when the caller gave up
%% first.
claim(_, false) ->
    ok;
claim(Key, true) ->
    try ets:insert_new(?CLAIMS, {Key, submitting}) of
        true -> ok;
        false -> ets:delete(?CLAIMS, Key), cancelled
    catch error:badarg -> ok
    end.

%% Checked: register it, unless the caller gave up meanwhile.
proceed(_, false) ->
    true;
proceed(Key, true) ->
    try replace(Key, submitting, registering)
    catch error:badarg -> true
    end.

%% Registered (or answered with an error).
claimed(_, false) ->
    ok;
claimed(Key, true) ->
    _ = (catch ets:update_element(?CLAIMS, Key, {2, submitted})),
    ok.

%% Atomically: the claim of `Key' goes from `From' to `To'.
replace(Key, From, To) ->
    ets:select_replace(?CLAIMS, [{{Key, From}, [], [{{{const, Key}, {const, To}}}]}]) =:= 1.

now_ms() ->
    erlang:monotonic_time(millisecond).

%% @doc A launch's node option (the last one given, as for every option), or `none': the
%% one check a local launch pays.
-spec node_option(term()) -> none | {node, term()}.
node_option([]) -> none;
node_option(Opts) when is_list(Opts) -> node_in(Opts, none);
node_option(#{node := Node}) -> {node, Node};
node_option(_) -> none.

node_in([{node, Node} | Rest], _) -> node_in(Rest, {node, Node});
node_in([_ | Rest], Found) -> node_in(Rest, Found);
node_in([], Found) -> Found;
node_in(_, _) -> none.

%% @doc A launch (`async', as `erlcuda:launch/3') or a launch_sync (`sync') with a node
%% option: run here, or sent to the node.
-spec launch(term(), term(), term(), erlcuda:options(), mode()) -> term().
launch(Node, Kernel, Args, Opts, Mode) ->
    launch(Node, Kernel, Args, without_node(Opts), Mode, ?REPICKS).

launch(Node, Kernel, Args, Opts, Mode, Repicks) ->
    case target(Node, Args, Opts) of
        local -> local(Kernel, Args, Opts, Mode);
        {local, Device} -> local(Kernel, Args, with_device(Opts, Device), Mode);
        {remote, To, undefined} -> remote(To, Kernel, Args, Opts, Mode);
        {remote, To, Device} ->
            %% `{node, any}' chose it.
            ok = erlcuda_cluster:sent(To, Device),
            case remote(To, Kernel, Args, with_device(Opts, Device), Mode) of
                %% It left the cluster since: choose again.
                {error, {bad_node, To}} when Repicks > 0 ->
                    launch(Node, Kernel, Args, Opts, Mode, Repicks - 1);
                Result ->
                    Result
            end;
        {error, _} = Error -> Error
    end.

%% @doc A launch without a node option whose check found `Buffer' of another node: it runs
%% there when that node is in the cluster (and holds all the launch's buffers).
-spec follow(term(), term(), term(), erlcuda:options(), mode()) -> term().
follow({erlcuda_buffer, Node, _, _, _, _, _} = Buffer, Kernel, Args, Opts, Mode) ->
    case erlcuda_cluster:is_member(Node) of
        true -> launch(Node, Kernel, Args, Opts, Mode);
        false -> {error, {remote_buffer, Buffer}}
    end.

local(Kernel, Args, Opts, async) -> erlcuda:launch(Kernel, Args, Opts);
local(Kernel, Args, Opts, sync) -> erlcuda:launch_sync(Kernel, Args, Opts).

%% Where a launch runs: here, on a node of the cluster (with the device `{node, any}'
%% chose), or nowhere.
target(any, Args, Opts) ->
    case buffers(Args) of
        [] ->
            case device_option(Opts) of
                Want when Want =:= any; is_integer(Want), Want >= 0 ->
                    case erlcuda_cluster:pick(Want) of
                        none -> local;
                        {Node, Device} when Node =:= node() -> {local, Device};
                        {Node, Device} -> {remote, Node, Device}
                    end;
                _ ->
                    %% A bad device: the local check answers it.
                    local
            end;
        [{erlcuda_buffer, Node, _, _, _, _, _} = B | Rest] ->
            case [Other || {erlcuda_buffer, N, _, _, _, _, _} = Other <- Rest, N =/= Node] of
                [Other | _] -> {error, {remote_buffer, Other}};
                [] when Node =:= node() -> local;
                [] ->
                    case erlcuda_cluster:is_member(Node) of
                        true -> {remote, Node, undefined};
                        false -> {error, {remote_buffer, B}}
                    end
            end
    end;
target(Node, Args, _) when is_atom(Node) ->
    case [B || {erlcuda_buffer, N, _, _, _, _, _} = B <- buffers(Args), N =/= Node] of
        [B | _] ->
            {error, {remote_buffer, B}};
        [] when Node =:= node() ->
            local;
        [] ->
            case erlcuda_cluster:is_member(Node) of
                true -> {remote, Node, undefined};
                false -> {error, {bad_node, Node}}
            end
    end;
target(Node, _, _) ->
    {error, {bad_option, {node, Node}}}.

buffers(Args) when is_list(Args) ->
    try [A || A <- Args, erlcuda_job:is_buffer(A)]
    catch error:_ -> []
    end;
buffers(_) ->
    [].

%% For `{node, any}': the device asked for, `any' by default (every device of every node).
device_option(Opts) when is_map(Opts) -> maps:get(device, Opts, any);
device_option(Opts) -> proplists:get_value(device, lists:reverse(Opts), any).

with_device(Opts, Device) when is_map(Opts) -> Opts#{device => Device};
with_device(Opts, Device) -> Opts ++ [{device, Device}].

%% @doc Options without their node option.
-spec without_node(erlcuda:options()) -> erlcuda:options().
without_node(Opts) when is_map(Opts) -> maps:remove(node, Opts);
without_node(Opts) -> [O || O <- Opts, not is_node_option(O)].

is_node_option({node, _}) -> true;
is_node_option(_) -> false.

%% The caller's side of a remote job.
remote(Node, Kernel, Args, Opts, Mode) ->
    case sync_options(Opts) of
        {error, _} = Error ->
            Error;
        {ok, Timeout, Keeps} ->
            Id = erlcuda_jobs:next_id(),
            Alias = alias([reply]),
            Key = {Node, Id},
            Sync = Mode =:= sync,
            %% What the reply names: a launch_sync waits for its alias, as a local one does.
            Tag = case Sync of
                      true -> Alias;
                      false -> Id
                  end,
            true = ets:insert(?RECORDS, {Key, Alias, Tag}),
            %% Checked after the record is in: the agent forgets a node that went down
            %% before it answers the node's records, so either it answers this one or
            %% this caller sees the node gone and takes its record back.
            Sent = erlcuda_cluster:is_member(Node)
                andalso spawn_job(Node, [Id, Alias, self(), Sync, Kernel, Args, Opts]),
            Taken = case Sent of
                        true -> false;
                        false -> ets:take(?RECORDS, Key) =/= []
                    end,
            if
                Taken -> unalias(Alias), {error, {bad_node, Node}};
                Sync -> await(Key, Alias, Timeout, Keeps);
                true -> {ok, Id}
            end
    end.

spawn_job(Node, Args) ->
    try erlang:spawn_request(Node, ?MODULE, execute, Args, [{reply, no}]) of
        _ -> true
    catch error:_ -> false
    end.

%% What the caller needs of the options: launch_sync's timeout, and whether results stay
%% on the device (their buffers are freed if the wait ends first). The rest is checked on
%% the executing node.
sync_options(Opts) when is_map(Opts) ->
    sync_options(maps:to_list(Opts));
sync_options(Opts) ->
    Timeout = proplists:get_value(timeout, lists:reverse(Opts), 5000),
    Keeps = proplists:get_value(keep, lists:reverse(Opts), false) =:= true,
    case Timeout of
        infinity -> {ok, Timeout, Keeps};
        T when is_integer(T), T >= 0, T =< ?MAX_TIMEOUT -> {ok, Timeout, Keeps};
        _ -> {error, {bad_option, {timeout, Timeout}}}
    end.

%% launch_sync's wait, as for a local job (the reply names the alias); the record goes once
%% the reply is here.
await({Node, Id} = Key, Alias, Timeout, Keeps) ->
    receive
        {erlcuda, Alias, {f32, Bin}} -> done(Key), erlcuda_protocol:f32_list(Bin);
        {erlcuda, Alias, {deferred, Raw}} -> done(Key), erlcuda_protocol:finish(Raw, list);
        {erlcuda, Alias, Result} -> done(Key), Result;
        {erlcuda, Alias, {Tag, Value}, Stamps} -> done(Key), {Tag, Value, Stamps}
    after Timeout ->
        %% As for a local job: a job that was to keep buffers is taken back if it is still
        %% registered there; one already answered has its reply on the way, and the
        %% buffers in it are freed.
        Late = case Keeps andalso cancel(Node, Id) of
                   false -> 0;
                   cancelled -> 0;
                   %% Its submitter will submit nothing, unless it came and went long
                   %% ago: then this node was told the job finished, and its record is
                   %% gone.
                   pending -> case is_recorded(Key) of
                                  true -> 0;
                                  false -> ?CALL_TIMEOUT
                              end;
                   _ -> ?CALL_TIMEOUT
               end,
        receive
            {erlcuda, Alias, R} -> free_found(R);
            {erlcuda, Alias, R, _} -> free_found(R)
        after Late -> ok
        end,
        unalias(Alias),
        receive
            {erlcuda, Alias, _} -> ok;
            {erlcuda, Alias, _, _} -> ok
        after 0 -> ok
        end,
        done(Key),
        {error, timeout}
    end.

%% (The table goes with the application: a caller may outlive it.)
done(Key) ->
    try ets:delete(?RECORDS, Key) of
        true -> ok
    catch error:badarg -> ok
    end.

is_recorded(Key) ->
    try ets:member(?RECORDS, Key)
    catch error:badarg -> false
    end.

cancel(Node, Id) ->
    try erpc:call(Node, ?MODULE, cancel_here, [node(), Id], ?CALL_TIMEOUT)
    catch _:_ -> unknown
    end.

free_found(Term) when is_tuple(Term) ->
    case erlcuda_job:is_buffer(Term) of
        true ->
            _ = case remote_node(Term) of
                    local -> erlcuda_buffers:free(Term);
                    {remote, Node} -> free(Node, Term)
                end,
            ok;
        false -> free_found(tuple_to_list(Term))
    end;
free_found(List) when is_list(List) ->
    lists:foreach(fun free_found/1, List);
free_found(_) ->
    ok.

%% @doc The submitter, on the executing node: the same validate and submit as a local
%% caller's; a job refused here is answered through the alias, as its one reply.
-spec execute(erlcuda:job_id(), reference(), pid(), boolean(), term(), term(), term()) -> ok.
execute(Id, Alias, Caller, Sync, Kernel, Args, Opts) ->
    Key = {node(Caller), Id},
    case claim(Key, Sync) of
        ok -> submit(Key, Alias, Caller, Sync, Kernel, Args, Opts);
        cancelled -> ok
    end.

submit({_, Id} = Key, Alias, Caller, Sync, Kernel, Args, Opts) ->
    %% The submit is inside the try too: a submitter that raised would leave its claim
    %% and its caller without an answer (a second answer, were the job registered, is
    %% dropped by the one-shot alias).
    Result = try
                 case erlcuda_job:validate(Kernel, Args, Opts) of
                     {ok, Job} ->
                         case proceed(Key, Sync) of
                             true -> erlcuda_submit:submit(deadline(Job, Sync),
                                                           {erlcuda_remote, Alias, Id, Sync,
                                                            Caller});
                             false -> cancelled
                         end;
                     {error, _} = Error ->
                         Error
                 end
             catch
                 Class:Why ->
                     {error, {internal, iolist_to_binary(
                                          io_lib:format("~0P", [{Class, Why}, 20]))}}
             end,
    case Result of
        {ok, _} -> claimed(Key, Sync);
        cancelled -> _ = (catch ets:delete(?CLAIMS, Key)), ok;
        {error, _} = E ->
            Alias ! {erlcuda, reply_tag(Alias, Id, Sync), E},
            finished(node(Caller), Id, Sync),
            claimed(Key, Sync)
    end.

reply_tag(Alias, _, true) -> Alias;
reply_tag(_, Id, false) -> Id.

deadline(#{timeout := T} = Job, true) when is_integer(T) ->
    Job#{deadline => erlang:monotonic_time(millisecond) + T};
deadline(Job, _) ->
    Job.

%% The agent's side.

%% @doc `Node' went down: every job recorded for it is answered `{error, {node_down,
%% Node}}', through its alias.
-spec node_down(node()) -> ok.
node_down(Node) ->
    Keys = ets:select(?RECORDS, [{{{Node, '_'}, '_', '_'}, [], [{element, 1, '$_'}]}]),
    lists:foreach(fun(Key) ->
                          case ets:take(?RECORDS, Key) of
                              [{_, Alias, Tag}] ->
                                  Alias ! {erlcuda, Tag, {error, {node_down, Node}}};
                              [] -> ok
                          end
                  end, Keys).

%% @doc The nodes this node has jobs recorded for.
-spec recorded_nodes() -> [node()].
recorded_nodes() ->
    try recorded(ets:first(?RECORDS), [])
    catch error:badarg -> []
    end.

%% Keys are {Node, Id}, Id an integer: {Node, []} sorts after every key of Node.
recorded('$end_of_table', Acc) -> lists:reverse(Acc);
recorded({Node, _}, Acc) -> recorded(ets:next(?RECORDS, {Node, []}), [Node | Acc]).

%% @doc `Ids' are this node's jobs that `Node' finished since it was last asked: their
%% records go.
-spec reconcile(node(), [erlcuda:job_id()]) -> ok.
reconcile(Node, Ids) ->
    lists:foreach(fun(Id) -> ets:delete(?RECORDS, {Node, Id}) end, Ids).

%% Buffers of other nodes.

%% @doc `{remote, Node}' for a buffer of another node of the cluster; `local' for anything
%% else (a buffer of this node, of a node outside the cluster, or no buffer), which the
%% local checks answer.
-spec remote_node(term()) -> local | {remote, node()}.
remote_node({erlcuda_buffer, Node, _, _, _, _, _} = Buffer) when Node =/= node() ->
    case erlcuda_job:is_buffer(Buffer) andalso erlcuda_cluster:is_member(Node) of
        true -> {remote, Node};
        false -> local
    end;
remote_node(_) ->
    local.

%% @doc Free a buffer of `Node', as the caller (its owner).
-spec free(node(), term()) -> ok | {error, erlcuda:reason()}.
free(Node, Buffer) ->
    case call(Node, erlcuda_buffers, free, [Buffer, self()]) of
        %% The connection dropped: that node freed it then, as its owner's.
        {error, {node_down, Node}} -> ok;
        Result -> Result
    end.

%% @doc Hand a buffer of `Node' to `Pid', as the caller (its owner).
-spec give(node(), term(), term()) -> ok | {error, erlcuda:reason()}.
give(Node, Buffer, Pid) ->
    call(Node, erlcuda_buffers, give, [Buffer, Pid, self()]).

%% @doc What `Node' knows of one of its buffers.
-spec buffer_info(node(), term()) -> map() | {error, erlcuda:reason()}.
buffer_info(Node, Buffer) ->
    call(Node, erlcuda_buffers, info, [Buffer]).

call(Node, M, F, A) ->
    try erpc:call(Node, M, F, A, ?CALL_TIMEOUT)
    catch
        error:{erpc, noconnection} -> {error, {node_down, Node}};
        error:{erpc, timeout} -> {error, timeout};
        error:undef -> {error, {bad_node, Node}};
        Class:Why -> {error, {internal, iolist_to_binary(io_lib:format("~0P", [{Class, Why}, 20]))}}
    end.
