%% @private
%% The table of jobs that are owed a reply. A job is registered before its frame is
%% written; whoever takes its entry (the port owner with a result, the sweep after a worker
%% death, the caller whose write failed, or the sweep of dead callers) owes the one reply,
%% and `ets:take/2' makes sure only one of them gets it.
-module(erlcuda_jobs).

-export([create/0, next_id/0, register/1, started/2, complete/2, withdraw/2, cancel/1, let_go/1,
         claim/1, disown/1, fail_all/1, sweep_dead_callers/0, size/0, counters/0,
         answered/0, owner/1]).

-export_type([entry/0, reply_to/0]).

-define(TAB, erlcuda_jobs).
-define(COUNTERS, {?MODULE, counters}).
-define(IDS, {?MODULE, ids}).
%% counters: submitted, answered ok, answered with an error, dropped (caller gone), quiet
%% jobs answered (erlcuda_transports': in no other figure)
-define(SUBMITTED, 1).
-define(OK, 2).
-define(ERROR, 3).
-define(DROPPED, 4).
-define(QUIET, 5).
-define(NO_SLOT, <<"the worker answered a result in shared memory for a job that gave it no "
                   "result slot">>).
-define(MISMATCH, <<"the worker's reply did not fit its job (kind, element type or length): "
                    "the worker is restarted">>).

-record(job, {id :: erlcuda:job_id(),
              reply_to :: pid() | reference(),
              caller :: pid(),
              device :: non_neg_integer(),
              queues :: erlcuda_status:queues(),
              kernel :: atom(),
              format :: erlcuda:format(),
              trace :: boolean(),
              %% its telemetry; `waiter' once a process waits for the reply (launch_sync,
              %% a proxy, await), which runs the stop event itself
              span = none :: erlcuda_telemetry:span(),
              waiter = false :: boolean(),
              quiet = false :: boolean(),
              files = [] :: erlcuda_shm:kept(),
              %% its caller stopped waiting, and its operands' files went then (`let_go/1')
              let_go = false :: boolean(),
              ctx = none :: erlcuda_protocol:ctx(),
              expect = any :: erlcuda_protocol:expect()}).

%% Where a job's reply goes: the caller's pid (launch), its alias (launch_sync), or, for a
%% job of a caller of another node, the alias of its proxy here (erlcuda_remote) with that
%% caller, which owns the buffers the job keeps.
-type reply_to() :: pid() | reference() | {erlcuda_proxy, reference(), pid()}.

-type entry() :: #{id := erlcuda:job_id(), reply_to := reply_to(), caller := pid(),
                   device := non_neg_integer(), queues := erlcuda_status:queues(),
                   kernel := atom(), format := erlcuda:format(), trace := boolean(),
                   quiet => boolean(),
                   files => erlcuda_shm:kept(),
                   ctx => erlcuda_protocol:ctx(), expect => erlcuda_protocol:expect(),
                   span => erlcuda_telemetry:span()}.

%% @doc The table, created by the application's process so that it outlives the port owner.
-spec create() -> ok.
create() ->
    ?TAB = ets:new(?TAB, [set, public, named_table, {keypos, #job.id},
                          {write_concurrency, true}, {read_concurrency, true}]),
    persistent_term:put(?COUNTERS, counters:new(5, [write_concurrency])),
    create_ids().

%% The id counter lives for the node's life, not the application's: a reply to a job of an
%% earlier start (still in a caller's mailbox, or on its way from another node) can never
%% carry a new job's id. It starts from the clock, in sixteenths of a microsecond, so a
%% node restarted under the same name does not issue its earlier life's ids either (it
%% would take sixteen jobs a microsecond, sustained, to catch up with the clock); the ids
%% stay small integers and fit the wire's 64 bits.
create_ids() ->
    case persistent_term:get(?IDS, undefined) of
        undefined ->
            Ids = atomics:new(1, [{signed, false}]),
            ok = atomics:put(Ids, 1, erlang:system_time(microsecond) bsl 4),
            persistent_term:put(?IDS, Ids);
        _ ->
            ok
    end.

%% @doc A job id: never issued before on this node, in this life or an earlier one of the
%% same name (it travels as 64 bits).
-spec next_id() -> erlcuda:job_id().
next_id() ->
    atomics:add_get(persistent_term:get(?IDS), 1, 1).

-spec register(entry()) -> ok.
register(#{id := Id, reply_to := ReplyTo, caller := Caller, device := Device,
           queues := Queues, kernel := Kernel, format := Format, trace := Trace} = Entry) ->
    To = case ReplyTo of
             {erlcuda_proxy, Alias, _Owner} -> Alias;
             _ -> ReplyTo
         end,
    true = ets:insert(?TAB, #job{id = Id, reply_to = To, caller = Caller,
                                 device = Device, queues = Queues, kernel = Kernel,
                                 format = Format, trace = Trace,
                                 span = maps:get(span, Entry, none),
                                 quiet = maps:get(quiet, Entry, false),
                                 %% an alias is waited on (launch_sync, a proxy)
                                 waiter = is_reference(To),
                                 files = maps:get(files, Entry, []),
                                 ctx = maps:get(ctx, Entry, none),
                                 expect = maps:get(expect, Entry, any)}),
    maps:get(quiet, Entry, false) orelse counters:add(counters_ref(), ?SUBMITTED, 1),
    ok.

%% @doc The start event's span of a registered job, for its stop event; `false' when the
%% job was answered already.
-spec started(erlcuda:job_id(), erlcuda_telemetry:span()) -> boolean().
started(Id, Span) ->
    ets:update_element(?TAB, Id, {#job.span, Span}).

%% @doc Who owns the buffers a job keeps: its caller, or a remote job's caller.
-spec owner(reply_to()) -> pid().
owner({erlcuda_proxy, _, Owner}) -> Owner;
owner(_) -> self().

%% @doc Deliver the job's reply (its record from the worker, or an error decided here) to
%% its caller, once; `none' when the job was already answered or dropped; `mismatch' when
%% the record is not of the kind, type or length the job expects: the job is answered
%% `{error, {internal, _}}', and a worker that confuses its jobs must not be believed again.
-spec complete(erlcuda:job_id(), erlcuda_protocol:reply() | {error, erlcuda:reason()}) ->
    ok | none | mismatch.
complete(Id, {error, _} = Reply) ->
    deliver(ets:take(?TAB, Id), Reply);
complete(Id, Reply) ->
    case ets:take(?TAB, Id) of
        [#job{expect = Expect}] = Taken ->
            case erlcuda_protocol:fits(Expect, Reply) of
                true ->
                    deliver(Taken, Reply);
                false ->
                    _ = deliver(Taken, {error, {internal, ?MISMATCH}}),
                    mismatch
            end;
        [] ->
            none
    end.

deliver(Taken, Reply) ->
    case Taken of
        [#job{let_go = true}] ->
            %% its caller stopped waiting: nobody to answer, and its result unread
            _ = discard(Taken, ?DROPPED, 1, timeout),
            ok;
        [#job{files = Files} = Job] ->
            case {erlcuda_protocol:file_result(Reply), lists:keyfind(result, 1, Files)} of
                {{file, Bytes, PartBytes}, {result, Slot}} ->
                    %% Answered: the worker has done with its operands. The result is read
                    %% by a deliverer, or by the slot's part process for an alias's one
                    %% reply: this process serves every job. Later replies to the same
                    %% caller wait behind it (erlcuda_delivery).
                    erlcuda_shm:done(lists:keydelete(result, 1, Files)),
                    erlcuda_status:dequeue(Job#job.queues, Job#job.device),
                    Send = fun(R) -> reply(Job, R, false, fun(To, M) -> To ! M, ok end) end,
                    erlcuda_delivery:run(
                      Job#job.reply_to,
                      fun() -> Send(erlcuda_shm:take_result(Slot, Bytes, PartBytes)) end,
                      fun() -> erlcuda_shm:take_result_then(Slot, Bytes, PartBytes, Send) end);
                {{file, _, _}, false} ->
                    erlcuda_shm:done(Files),
                    reply(Job, {error, {internal, ?NO_SLOT}}, true,
                          fun erlcuda_delivery:send/2);
                _ ->
                    erlcuda_shm:done(Files),
                    reply(Job, Reply, true, fun erlcuda_delivery:send/2)
            end;
        [] ->
            none
    end.

reply(#job{id = Id, reply_to = ReplyTo, format = Format, trace = Trace, ctx = Ctx} = Job,
      Reply, Dequeue, Send) ->
    %% launch_sync (and a proxy) waits for an alias, and its reply names that alias: no
    %% other message in its mailbox (an old reply, a forged one) can pass for it. It makes
    %% its own floats.
    Sync = is_reference(ReplyTo),
    Tag = case Sync of
              true -> ReplyTo;
              false -> Id
          end,
    Message = case Reply of
                  %% a traced job keeps its shape: no stage of the worker's ran
                  {error, _} when Trace -> {erlcuda, Tag, Reply, #{}};
                  {error, _} -> {erlcuda, Tag, Reply};
                  _ -> erlcuda_protocol:message(Tag, Reply, Format, Sync, Ctx)
              end,
    Result = element(3, Message),
    kept(Ctx, Result),
    count(Job, Result, Dequeue),
    ok = Send(ReplyTo, Message),
    %% Its handlers never run here: in the process that waits for the reply, or in the
    %% event process for a reply nobody waits for (any more: its waiter was killed).
    case Job of
        #job{span = none} ->
            ok;
        #job{waiter = false, span = Span} ->
            erlcuda_events:job_stop(Span, Result);
        #job{caller = Caller, span = Span} ->
            case is_process_alive(Caller) of
                true -> ok;
                false -> erlcuda_events:job_stop(Span, Result)
            end
    end.

%% @doc Take back a job whose frame was never written, in the process that launched it,
%% which is answered `Error' (its exception event runs here); `false' when someone else
%% already took it (and so answered it).
-spec withdraw(erlcuda:job_id(), {error, erlcuda:reason()}) -> boolean().
withdraw(Id, {error, Why} = Error) ->
    case discard(ets:take(?TAB, Id), ?SUBMITTED, -1, Why) of
        {true, Span} -> erlcuda_telemetry:job_stop(Span, Error), true;
        false -> false
    end.

%% @doc Drop a job of the calling process that stopped waiting for it (a timeout), if it is
%% still registered: it is never answered, and what it was to keep is freed after it.
%% `false' when it was already answered, or is not this process's. Its exception event is
%% the waiting process's to run.
-spec cancel(erlcuda:job_id()) -> boolean().
cancel(Id) ->
    case ets:lookup(?TAB, Id) of
        [#job{caller = Caller}] when Caller =:= self() ->
            discard(ets:take(?TAB, Id), ?DROPPED, 1, timeout) =/= false;
        _ ->
            false
    end.

%% @doc The calling process stopped waiting for its job `Id', which stays registered while
%% the worker holds it (its place in the device's queue with it): its operands' files and
%% slots are deleted now (the worker reads what it mapped already; an operand it has yet to
%% map fails the job, which then never runs), and its reply, whatever it is, is dropped
%% unanswered and counted as dropped. Its result slot stays until that reply: deleted
%% before the worker maps it, the result would come through the pipe instead. Nothing when
%% the job was answered already or is not this process's. Only the caller changes a job's
%% files, so the ones read here are the ones taken out, if the entry is still there.
-spec let_go(erlcuda:job_id()) -> ok.
let_go(Id) ->
    Self = self(),
    case ets:lookup(?TAB, Id) of
        [#job{caller = Self, files = Files}] ->
            {Result, Operands} = lists:partition(fun({result, _}) -> true; (_) -> false end,
                                                 Files),
            Taken = ets:update_element(?TAB, Id, [{#job.files, Result}, {#job.let_go, true}]),
            _ = [erlcuda_shm:delete(Operands) || Taken],
            ok;
        _ ->
            ok
    end.

%% @doc The calling process waits for the reply of its launch `Id' (erlcuda:await/2): its
%% stop event is this process's to run from now on (`{ok, Span}'). `answered' when the job
%% is not registered any more (its reply is here or on its way; its event is the event
%% process's), or was never this node's; `not_yours' when its reply goes to another process.
-spec claim(erlcuda:job_id()) -> {ok, erlcuda_telemetry:span()} | answered | not_yours.
claim(Id) ->
    Self = self(),
    case ets:lookup(?TAB, Id) of
        [#job{reply_to = Self, span = none}] ->
            {ok, none};
        [#job{reply_to = Self, span = Span}] ->
            %% One of the two takes the event: this update, or the reply that takes the
            %% entry first.
            case ets:update_element(?TAB, Id, {#job.waiter, true}) of
                true -> {ok, Span};
                false -> answered
            end;
        [#job{}] ->
            not_yours;
        [] ->
            answered
    end.

%% @doc The waiting process stopped waiting for job `Id' and has run its exception event:
%% no other event is run for it, whatever becomes of it.
-spec disown(erlcuda:job_id()) -> ok.
disown(Id) ->
    _ = ets:update_element(?TAB, Id, {#job.span, none}),
    ok.

%% @doc Answer every registered job with `{error, {worker_down, Why}}'.
-spec fail_all(term()) -> ok.
fail_all(Why) ->
    Ids = ets:select(?TAB, [{pattern([{#job.id, '$1'}]), [], ['$1']}]),
    lists:foreach(fun(Id) -> complete(Id, {error, {worker_down, Why}}) end, Ids).

%% @doc Drop the jobs of callers that died. A caller killed after it registered its job and
%% before its frame was written leaves a job nobody answers: nothing else would take its
%% entry or give back its place in the device's queue.
-spec sweep_dead_callers() -> non_neg_integer().
sweep_dead_callers() ->
    Jobs = ets:select(?TAB, [{pattern([{#job.id, '$1'}, {#job.caller, '$2'}]), [],
                              [{{'$1', '$2'}}]}]),
    length([Id || {Id, Caller} <- Jobs, not alive(Caller), drop(Id)]).

-spec size() -> non_neg_integer().
size() ->
    ets:info(?TAB, size).

%% @doc Jobs submitted, answered `ok', answered with an error, and dropped since the
%% application started.
-spec counters() -> #{submitted := integer(), ok := integer(), error := integer(),
                      dropped := integer()}.
counters() ->
    C = counters_ref(),
    #{submitted => counters:get(C, ?SUBMITTED), ok => counters:get(C, ?OK),
      error => counters:get(C, ?ERROR), dropped => counters:get(C, ?DROPPED)}.

%% @doc Jobs answered since the start, quiet ones too: what this node's rate counts (its
%% transport probe's jobs keep it busy, and a node busy answering nothing is measured slow).
-spec answered() -> non_neg_integer().
answered() ->
    C = counters_ref(),
    counters:get(C, ?OK) + counters:get(C, ?ERROR) + counters:get(C, ?QUIET).

%% Its caller is dead: whoever was to run the event, the event process does.
drop(Id) ->
    case discard(ets:take(?TAB, Id), ?DROPPED, 1, caller_down) of
        {true, Span} -> erlcuda_events:job_stop(Span, {error, caller_down}), true;
        false -> false
    end.

%% A job taken out without a reply: its place in the queue given back, and counted.
discard([#job{queues = Queues, device = Device, files = Files, ctx = Ctx, span = Span,
              quiet = Quiet}], Counter, Delta, Why) ->
    erlcuda_shm:delete(Files),
    kept(Ctx, {error, Why}),
    erlcuda_status:dequeue(Queues, Device),
    Quiet orelse counters:add(counters_ref(), Counter, Delta),
    {true, Span};
discard([], _, _, _) ->
    false.

%% The buffers a job was to keep: noted once made, dropped (and freed, in case the worker
%% made some) when the job failed or was never written.
kept(#{keep := [_ | _] = Ids, epoch := Epoch, device := Device}, {error, _}) ->
    erlcuda_buffers:abandon(Epoch, Device, Ids);
kept(#{keep := [_ | _]}, {ok, Value}) ->
    erlcuda_buffers:settle(Value);
kept(#{keep := [_ | _]}, {deferred, Raw}) ->
    erlcuda_buffers:settle(Raw);
kept(_, _) ->
    ok.

count(#job{queues = Queues, device = Device, quiet = Quiet}, Result, Dequeue) ->
    _ = [erlcuda_status:dequeue(Queues, Device) || Dequeue],
    Outcome = case Result of {error, _} -> ?ERROR; _ -> ?OK end,
    counters:add(counters_ref(), case Quiet of true -> ?QUIET; false -> Outcome end, 1),
    ok.

%% A match pattern for #job{}: the record's fields typed for dialyzer cannot hold '_'.
pattern(Fields) ->
    erlang:make_tuple(record_info(size, job), '_', [{1, job} | Fields]).

alive(Pid) -> is_process_alive(Pid).

counters_ref() ->
    persistent_term:get(?COUNTERS).
