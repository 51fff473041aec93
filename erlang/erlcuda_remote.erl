%% @private
%% Jobs on other nodes of the cluster, and buffers that live there.
%%
%% A launch that runs on another node (`{node, Node | any}', or buffers of that node) is a
%% local job of a proxy there: the caller spawns the proxy on the executing node
%% (`erlang:spawn_request/5'), which runs the same validate and submit as a local caller,
%% waits for its job's one reply, forwards it to the caller's one-shot alias (made with
%% `alias([reply])') and exits. The operands travel over distribution once, and so does
%% the result; the job ids there are that node's own.
%%
%% Exactly one reply: whoever watches the proxy answers through the same alias when it is
%% lost, and the runtime lets only the first message through.
%% - launch_sync: the caller monitors the proxy (the spawn request's monitor). A 'DOWN' for
%%   `noconnection' before the reply is `{error, {node_down, Node}}'. A timeout tells the
%%   proxy to take its job back (`{erlcuda_cancel, Alias}'): a job still registered is
%%   dropped there, with the buffers it was to keep; one answered meanwhile has the
%%   buffers in its reply freed there. A node that has not even answered the spawn by
%%   then has the request abandoned. The buffers a job keeps are its proxy's until the
%%   caller's side has taken the result over a live connection (the caller in its wait,
%%   the agent for a launch): only then are they given to the caller; a proxy whose
%%   result nobody takes in time frees them.
%% - launch: the caller records `{{Node, JobId}, Alias, Proxy}' (erlcuda_records) before
%%   the proxy is spawned, and goes on. The proxy tells this node's agent (erlcuda_cluster) that it
%%   runs; the agent monitors it, and the record goes with the proxy's 'DOWN': for a normal
%%   exit the reply went first, on the same connection; for `noconnection' (and on a
%%   nodedown, for a record whose proxy was not heard of yet) the agent answers
%%   `{error, {node_down, Node}}' through the alias. Records are bounded by the proxies
%%   alive: nothing on the executing node keeps a row per caller, so a restart there
%%   (its jobs answered `worker_down' by their proxies) leaves nothing behind here.
-module(erlcuda_remote).

-export([node_option/1, launch/5, follow/5, proxy/7, remote_node/1, free/2, give/3,
         buffer_info/2, without_node/1, await_launch/2]).

%% What `receive ... after' accepts.
-define(MAX_TIMEOUT, 4294967295).
%% How long a proxy holds a result that names buffers for the caller's side to take it.
-define(HAND_OVER_MS, 5000).
%% Calls to another node about buffers, and the wait for the proxy of a job that keeps
%% buffers once its launch_sync timed out.
-define(CALL_TIMEOUT, 5000).
%% How often a proxy tells the caller's agent again that it runs, while that agent
%% restarts, and how long it waits between two.
-define(ANNOUNCES, 50).
-define(ANNOUNCE_MS, 100).
%% How many times `{node, any}' chooses again when the node it chose left meanwhile.
-define(REPICKS, 3).

-type mode() :: async | sync.

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
%% option: sent to the node, or `{local, Opts}' when it runs here (with the options to run
%% it with: no node option, and the device `{node, any}' chose).
-spec launch(term(), term(), term(), erlcuda:options(), mode()) -> term().
launch(Node, Kernel, Args, Opts, Mode) ->
    launch(Node, Kernel, Args, without_node(Opts), Mode, ?REPICKS).

launch(Node, Kernel, Args, Opts, Mode, Repicks) ->
    case target(Node, Args, Opts) of
        local -> {local, Opts};
        {local, Device} -> {local, with_device(Opts, Device)};
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
    try [A || A <- Args, erlcuda_buffers:is_buffer(A)]
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
        {error, _} = Error -> Error;
        {ok, Timeout, Keeps} when Mode =:= sync ->
            remote_sync(Node, Kernel, Args, Opts, Timeout, Keeps);
        {ok, _, _} -> remote_async(Node, Kernel, Args, Opts)
    end.

remote_async(Node, Kernel, Args, Opts) ->
    Id = erlcuda_jobs:next_id(),
    Alias = alias([reply]),
    Key = {Node, Id},
    ok = erlcuda_records:record(Key, Alias, traced(Opts)),
    %% Checked after the record is in: the agent forgets a node that went down before it
    %% answers the node's records, so either it answers this one or this caller sees the
    %% node gone and takes its record back.
    Sent = erlcuda_cluster:is_member(Node)
        andalso spawn_proxy(Node, [Alias, Id, self(), false, Kernel, Args, Opts],
                            [{reply, no}]) =/= error,
    case Sent orelse not erlcuda_records:take_back(Key) of
        true -> {ok, Id};
        false -> unalias(Alias), {error, {bad_node, Node}}
    end.

remote_sync(Node, Kernel, Args, Opts, Timeout, Keeps) ->
    Alias = alias([reply]),
    case erlcuda_cluster:is_member(Node)
        andalso spawn_proxy(Node, [Alias, Alias, self(), true, Kernel, Args, Opts],
                            [monitor, {reply, yes}]) of
        Req when is_reference(Req) ->
            await_spawn(#{req => Req, alias => Alias, node => Node, keeps => Keeps,
                          traced => traced(Opts)}, deadline(Timeout));
        _ ->
            unalias(Alias),
            {error, {bad_node, Node}}
    end.

spawn_proxy(Node, Args, Opts) ->
    try erlang:spawn_request(Node, ?MODULE, proxy, Args, Opts)
    catch error:_ -> error
    end.

%% The spawn's reply comes before anything else from the proxy. A node that gives none
%% within the timeout (stopped, or cut off and not yet known to be) has the request
%% abandoned: the caller goes at once, or, for a job that keeps buffers, once the proxy
%% has taken the job back (at most ?CALL_TIMEOUT later).
await_spawn(#{req := Req, alias := Alias, node := Node, keeps := Keeps} = W, Deadline) ->
    receive
        {spawn_reply, Req, ok, Proxy} ->
            await(W#{proxy => Proxy}, Deadline);
        {spawn_reply, Req, error, noconnection} ->
            %% The request may have reached the node before the connection dropped, and
            %% its proxy run there: the job is not known not to have run.
            unalias(Alias),
            {error, {node_down, Node}};
        {spawn_reply, Req, error, _} ->
            unalias(Alias),
            {error, {bad_node, Node}}
    after remaining(Deadline) ->
        case Keeps of
            true -> late_spawn(W, deadline(?CALL_TIMEOUT));
            false -> abandon(W)
        end
    end.

late_spawn(#{req := Req, alias := Alias} = W, Until) ->
    receive
        {spawn_reply, Req, ok, Proxy} -> timed_out(W#{proxy => Proxy}, Until);
        {spawn_reply, Req, error, _} -> unalias(Alias), {error, timeout}
    after remaining(Until) ->
        abandon(W)
    end.

abandon(#{req := Req, alias := Alias} = W) ->
    case erlang:spawn_request_abandon(Req) of
        true ->
            %% A proxy that still starts there, once that node runs again, finds nobody to
            %% take what it makes.
            unalias(Alias),
            {error, timeout};
        false ->
            %% Its reply came meanwhile.
            receive
                {spawn_reply, Req, ok, Proxy} -> timed_out(W#{proxy => Proxy}, deadline(0));
                {spawn_reply, Req, error, _} -> unalias(Alias), {error, timeout}
            end
    end.

%% launch_sync's wait, as for a local job (the reply names the alias), with the proxy's
%% 'DOWN' too.
await(#{req := Req, alias := Alias} = W, Deadline) ->
    case erlcuda_await:reply(Alias, Deadline, Req) of
        {ok, Result} ->
            gone(Req),
            Result;
        {held, Proxy, Message} ->
            %% A result that names buffers: its proxy gives them to this caller once told
            %% it is taken, and then ends.
            Proxy ! {erlcuda_taken, Alias},
            taken(W, Message, max(Deadline, deadline(?CALL_TIMEOUT)));
        {down, Why} ->
            unalias(Alias),
            lost(W, Why);
        timeout ->
            timed_out(W, deadline(?CALL_TIMEOUT))
    end.

%% A proxy that does not end by `Until' (its node stopped answering): the buffers its
%% result names are freed as this caller's, should the proxy have given them already.
taken(#{req := Req} = W, Message, Until) ->
    receive
        {'DOWN', Req, process, _, normal} -> erlcuda_await:message(Message);
        {'DOWN', Req, process, _, Why} -> lost(W, Why)
    after remaining(Until) ->
        gone(Req),
        free_found(Message),
        {error, timeout}
    end.

lost(#{node := Node, traced := Traced}, Why) ->
    case erlcuda_records:lost(Node, Why) of
        {error, R} when Traced -> {error, R, #{}};
        Error -> Error
    end.

%% The proxy takes its job back, with what it was to keep, and ends at once. For a job that
%% keeps buffers the caller waits for its end (a reply sent first comes before its 'DOWN',
%% and the buffers in it are freed here), until `Until' for a node that does not answer;
%% any other goes at once.
timed_out(#{req := Req, alias := Alias, proxy := Proxy, keeps := Keeps}, Until) ->
    Proxy ! {erlcuda_cancel, Alias},
    _ = Keeps andalso receive {'DOWN', Req, process, _, _} -> true
                      after remaining(Until) -> false
                      end,
    gone(Req),
    erlcuda_await:drop(Alias, 0, fun free_found/1),
    {error, timeout}.

gone(Req) ->
    _ = demonitor(Req, [flush]),
    ok.

deadline(Ms) -> erlcuda_await:deadline(Ms).

remaining(Deadline) -> erlcuda_await:remaining(Deadline).

%% What the caller needs of the options: launch_sync's timeout, and whether results stay
%% on the device (their buffers are freed if the wait ends first). The rest is checked on
%% the executing node.
sync_options(Opts) when is_map(Opts) ->
    sync_options(maps:to_list(Opts));
sync_options(Opts) ->
    Keeps = proplists:get_value(keep, lists:reverse(Opts), false) =:= true,
    case proplists:get_value(timeout, lists:reverse(Opts), 5000) of
        infinity -> {ok, infinity, Keeps};
        T when is_integer(T), T >= 0, T =< ?MAX_TIMEOUT -> {ok, T, Keeps};
        T -> {error, {bad_option, {timeout, T}}}
    end.

free_found(Term) ->
    lists:foreach(fun(B) ->
                          _ = case remote_node(B) of
                                  local -> erlcuda_buffers:free(B);
                                  {remote, Node} -> free(Node, B)
                              end
                  end, found_buffers(Term)).

%% @doc erlcuda:await/2 for the calling process's launch `Id' on another node, until
%% `Deadline'; `not_remote' when this node has no record of it. When the time runs out, the
%% record is taken back (the agent no longer answers the job) and the proxy told to drop the
%% job; a result already on its way is returned instead: one the agent took the record for,
%% or one whose buffers the proxy is giving to the caller (which it sends itself once they
%% are the caller's). Otherwise the alias goes, and with it any later message.
-spec await_launch(erlcuda:job_id(), erlcuda_await:deadline()) -> term() | not_remote.
await_launch(Id, Deadline) ->
    case erlcuda_records:find(Id) of
        none ->
            not_remote;
        {Key, Alias} ->
            case erlcuda_await:take(Id, remaining(Deadline)) of
                {ok, Result} -> Result;
                timeout -> give_up(Id, Key, Alias)
            end
    end.

give_up(Id, Key, Alias) ->
    case erlcuda_records:take(Key) of
        {Proxy, none} ->
            unalias(Alias),
            _ = [Proxy ! {erlcuda_cancel, Id} || is_pid(Proxy)],
            %% A result the proxy sent straight, before the alias went.
            case erlcuda_await:take(Id, 0) of
                {ok, Result} -> Result;
                timeout -> {error, timeout}
            end;
        {_, Held} ->
            late(Id, Alias, Held);
        answered ->
            late(Id, Alias, none)
    end.

%% A result on its way; if it does not come in time, the buffers it names (given to this
%% caller or not) are freed, and the alias goes.
late(Id, Alias, Held) ->
    case erlcuda_await:take(Id, ?CALL_TIMEOUT) of
        {ok, Result} ->
            Result;
        timeout ->
            unalias(Alias),
            free_found(Held),
            {error, timeout}
    end.

%% The proxy, on the executing node.

%% @doc The proxy of a caller of another node: the same validate and submit as a local
%% caller's, then the job's one reply, or its refusal, forwarded to the caller's alias
%% under `Tag' (the job id of a launch, the alias of a launch_sync). A launch's proxy tells
%% the caller's agent first, which watches it, and ends only once the agent said so.
-spec proxy(reference(), erlcuda:job_id() | reference(), pid(), boolean(), term(), term(),
            term()) -> ok.
proxy(Alias, Tag, Caller, Sync, Kernel, Args, Opts) ->
    Agent = {erlcuda_cluster, node(Caller)},
    Watch = case Sync of
                true -> none;
                false -> announce(Agent, Tag)
            end,
    Reply = try run(Sync, Kernel, Args, Opts)
            catch Class:Why -> {error, {internal, iolist_to_binary(
                                                    io_lib:format("~0P", [{Class, Why}, 20]))}}
            end,
    _ = deliver(Reply, found_buffers(Reply), {Alias, Tag, Caller, Watch, Agent}, traced(Opts)),
    ok.

%% A result that names no buffer goes straight to the caller's alias. One that names
%% buffers is held (they stay the proxy's) until whoever answers the caller takes it over
%% the connection as it is now: the launch_sync caller itself, or for a launch the caller's
%% agent, which holds it in the job's record. Only then are the buffers given to the
%% caller; a refusal (the caller gave up, or was answered node_down), a lost connection or
%% no answer in time frees them here. A proxy that started after its caller's connection
%% had dropped, or that finished while its node was stopped, can so never hand buffers to
%% a caller that stopped waiting for them.
deliver(cancelled, _, {_, Tag, _, Watch, Agent}, _) ->
    watched(Watch, Agent, Tag, ?ANNOUNCES);
deliver(Reply, [], {Alias, Tag, _, Watch, Agent}, Traced) ->
    Alias ! message(Reply, Tag, Traced),
    watched(Watch, Agent, Tag, ?ANNOUNCES);
deliver(Reply, Buffers, {Alias, Tag, Caller, none, _}, Traced) ->
    Connection = connection(node(Caller)),
    Alias ! {erlcuda_held, Alias, self(), message(Reply, Tag, Traced)},
    case taken(Alias) of
        unanswered ->
            freed = settle(unanswered, Connection, Buffers, Caller),
            %% A caller still watching is answered by this end: its result is gone.
            exit({shutdown, unanswered});
        Outcome ->
            settle(Outcome, Connection, Buffers, Caller)
    end;
deliver(Reply, Buffers, {Alias, Tag, Caller, Watch, Agent}, Traced) ->
    Connection = connection(node(Caller)),
    Message = message(Reply, Tag, Traced),
    Outcome = held(Watch, Agent, Tag, Message, ?ANNOUNCES),
    %% Once the buffers are the caller's the proxy sends the result itself too, and the
    %% alias lets only the first through: the agent's record may go with a restart of
    %% erlcuda on the caller's node before it delivers it. A result given to nobody is
    %% answered node_down the same way, for an agent that was gone too long to answer.
    Alias ! case settle(Outcome, Connection, Buffers, Caller) of
                given -> Message;
                _ -> erlcuda_records:error_message(Tag, {error, {node_down, node()}}, Traced)
            end,
    ok.

message({traced, R, Stamps}, Tag, _) -> {erlcuda, Tag, R, Stamps};
message({error, _} = E, Tag, Traced) -> erlcuda_records:error_message(Tag, E, Traced);
message(R, Tag, _) -> {erlcuda, Tag, R}.

taken(Tag) ->
    receive
        {erlcuda_taken, Tag} -> taken;
        {erlcuda_cancel, Tag} -> refused
    after ?HAND_OVER_MS -> unanswered
    end.

%% The caller's agent holds the result; an agent that restarts meanwhile is told again.
held(Mon, Agent, Tag, Message, Left) ->
    Agent ! {erlcuda_held, Tag, self(), Message},
    receive
        {erlcuda_taken, Tag} -> demonitor(Mon, [flush]), taken;
        {erlcuda_cancel, Tag} -> demonitor(Mon, [flush]), refused;
        {'DOWN', Mon, process, _, noconnection} -> refused;
        {'DOWN', Mon, process, _, _} when Left > 0 ->
            timer:sleep(?ANNOUNCE_MS),
            held(announce(Agent, Tag), Agent, Tag, Message, Left - 1);
        {'DOWN', Mon, process, _, _} -> unanswered
    after ?HAND_OVER_MS ->
        demonitor(Mon, [flush]),
        unanswered
    end.

%% A take counts only over the connection the result went out on: one that came over a
%% newer connection was sent by a side that has not yet seen the old one drop, and answers
%% the job node_down for it. The caller's monitor, set once the buffers are its own, is
%% checked the same way: set on a newer connection, it would never see the drop the
%% caller's side answered.
settle(taken, Connection, Buffers, Caller) ->
    Node = node(Caller),
    case connection(Node) of
        Connection ->
            _ = [erlcuda_buffers:give(B, Caller) || B <- Buffers],
            ok = erlcuda_buffers:watch_now(Caller),
            case connection(Node) of
                Connection -> given;
                _ -> _ = [erlcuda_buffers:free(B, Caller) || B <- Buffers], freed
            end;
        _ ->
            settle(refused, Connection, Buffers, Caller)
    end;
settle(Outcome, _, Buffers, _) when Outcome =:= refused; Outcome =:= unanswered ->
    _ = [erlcuda_buffers:free(B) || B <- Buffers],
    freed.

%% This node's identifier of its connection to `Node' now, `none' when there is none.
connection(Node) ->
    case lists:keyfind(Node, 1, erlang:nodes(connected, #{connection_id => true})) of
        {_, #{connection_id := Id}} -> Id;
        false -> none
    end.

%% The caller's agent is told this proxy runs, and watched meanwhile: an agent that
%% restarts before it answers is told again.
announce(Agent, Tag) ->
    Mon = monitor(process, Agent),
    Agent ! {erlcuda_proxy, Tag, self()},
    Mon.

watched(none, _, _, _) ->
    ok;
watched(Mon, Agent, Tag, Left) ->
    receive
        {erlcuda_watched, Tag} ->
            demonitor(Mon, [flush]),
            ok;
        {'DOWN', Mon, process, _, noconnection} ->
            %% its node answers the job node_down
            ok;
        {'DOWN', Mon, process, _, _} when Left > 0 ->
            timer:sleep(?ANNOUNCE_MS),
            watched(announce(Agent, Tag), Agent, Tag, Left - 1);
        {'DOWN', Mon, process, _, _} ->
            ok
    end.

traced(Opts) when is_map(Opts) -> maps:get(trace, Opts, false) =:= true;
traced(Opts) when is_list(Opts) -> proplists:get_value(trace, lists:reverse(Opts)) =:= true;
traced(_) -> false.

run(Sync, Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, Job} ->
            %% The buffers the job keeps are the proxy's until it hands them over with the
            %% reply: a proxy that dies first takes them with it.
            Mine = alias(),
            case erlcuda_submit:submit(job_deadline(Job, Sync), {erlcuda_proxy, Mine, self()}) of
                {ok, Id, Span} ->
                    Reply = wait(Id, Mine, Sync),
                    %% The proxy waits for the job: its stop event is the proxy's.
                    ok = erlcuda_telemetry:job_stop(Span, case Reply of
                                                              cancelled -> {error, timeout};
                                                              {traced, R, _} -> R;
                                                              R -> R
                                                          end),
                    Reply;
                {error, _} = Error ->
                    Error
            end;
        {error, _} = Error ->
            Error
    end.

job_deadline(#{timeout := T} = Job, true) when is_integer(T) ->
    Job#{deadline => erlang:monotonic_time(millisecond) + T};
job_deadline(Job, _) ->
    Job.

%% The job's reply, made final for a launch (a launch_sync's caller makes its own floats).
%% The port owner is watched: a job it can no longer answer is `worker_down'. A caller
%% that stopped waiting has the job taken back.
wait(Id, Mine, Sync) ->
    Owner = monitor(process, erlcuda_worker),
    receive
        {erlcuda, Mine, Result} ->
            demonitor(Owner, [flush]), final(Result, Sync);
        {erlcuda, Mine, R, Stamps} ->
            demonitor(Owner, [flush]), {traced, R, Stamps};
        {erlcuda_cancel, _} ->
            demonitor(Owner, [flush]), cancel(Id, Mine);
        {'DOWN', Owner, process, _, Why} ->
            receive
                {erlcuda, Mine, Result} -> final(Result, Sync);
                {erlcuda, Mine, R, Stamps} -> {traced, R, Stamps}
            after 0 -> {error, {worker_down, Why}}
            end
    end.

final(Result, true) -> Result;
final(Result, false) -> erlcuda_await:result(Result).

%% The caller stopped waiting: a job still registered is dropped (its buffers freed after
%% it); one answered meanwhile has its reply here, whose buffers go.
cancel(Id, Mine) ->
    case erlcuda_jobs:cancel(Id) of
        true ->
            cancelled;
        false ->
            receive
                {erlcuda, Mine, R} -> free_here(R);
                {erlcuda, Mine, R, _} -> free_here(R)
            end,
            cancelled
    end.

free_here(Term) ->
    _ = [erlcuda_buffers:free(B) || B <- found_buffers(Term)],
    ok.

found_buffers(Term) when is_tuple(Term) ->
    case erlcuda_buffers:is_buffer(Term) of
        true -> [Term];
        false -> found_buffers(tuple_to_list(Term))
    end;
found_buffers(List) when is_list(List) ->
    lists:append([found_buffers(T) || T <- List]);
found_buffers(_) ->
    [].

%% Buffers of other nodes.

%% @doc `{remote, Node}' for a buffer of another node of the cluster; `local' for anything
%% else (a buffer of this node, of a node outside the cluster, or no buffer), which the
%% local checks answer.
-spec remote_node(term()) -> local | {remote, node()}.
remote_node({erlcuda_buffer, Node, _, _, _, _, _} = Buffer) when Node =/= node() ->
    case erlcuda_buffers:is_buffer(Buffer) andalso erlcuda_cluster:is_member(Node) of
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
