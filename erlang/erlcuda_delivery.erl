%% @private
%% Replies in the order launched when some of them take a while to deliver.
%%
%% A result in shared memory (a result slot) is read and sent by a process of its own (a
%% deliverer), so that the port owner never copies it. A later reply to the same caller must
%% not overtake it: while a caller (a pid or an alias) has a deliverer, every reply to it
%% goes through that deliverer, in order. A deliverer that has nothing left asks the port
%% owner to retire it, and the port owner does so only if it sent it nothing meanwhile, so
%% no reply is ever sent to a deliverer that has gone. An alias's one reply, which nothing
%% can overtake, is sent by the slot's part process itself (`run/3'): no deliverer to spawn
%% and no hop between the read and the caller. Only the port owner calls `send/2', `run/2'
%% and `run/3' (it owns the table); a deliverer outlives a crashed port owner only to finish
%% what it was given.
-module(erlcuda_delivery).

-export([init/0, send/2, run/2, run/3, retire/3]).

-include_lib("kernel/include/logger.hrl").

-define(TAB, erlcuda_delivery).

%% @doc The table of callers with a deliverer; in the port owner.
-spec init() -> ok.
init() ->
    ?TAB = ets:new(?TAB, [set, protected, named_table]),
    ok.

%% @doc Send `Message' to `To' now, or after what its deliverer holds.
-spec send(pid() | reference(), term()) -> ok.
send(To, Message) ->
    case ets:lookup(?TAB, To) of
        [{_, Pid, Sent}] ->
            Pid ! {send, Message},
            true = ets:insert(?TAB, {To, Pid, Sent + 1}),
            ok;
        [] ->
            To ! Message,
            ok
    end.

%% @doc Have a deliverer of `To' run `Fun' (which sends `To' its reply), after what it holds.
-spec run(pid() | reference(), fun(() -> term())) -> ok.
run(To, Fun) ->
    case ets:lookup(?TAB, To) of
        [{_, Pid, Sent}] ->
            Pid ! {run, Fun},
            true = ets:insert(?TAB, {To, Pid, Sent + 1});
        [] ->
            Owner = self(),
            Pid = spawn(fun() -> start(To, Owner) end),
            Pid ! {run, Fun},
            true = ets:insert(?TAB, {To, Pid, 1})
    end,
    ok.

%% @doc `run/2', or, for an alias with no deliverer, `Elsewhere()': something that sends the
%% reply itself and does not wait (a result slot's part process reading it). An alias gets
%% one reply (a `launch_sync', a proxy's call): nothing to keep in order, and no process
%% to spawn for it.
-spec run(pid() | reference(), fun(() -> term()), fun(() -> term())) -> ok.
run(To, Fun, Elsewhere) when is_reference(To) ->
    case ets:member(?TAB, To) of
        true -> run(To, Fun);
        false -> _ = Elsewhere(), ok
    end;
run(To, Fun, _) ->
    run(To, Fun).

%% @doc A deliverer of `To' has done `Done' things: retire it if that is all it was given.
-spec retire(pid() | reference(), pid(), non_neg_integer()) -> ok.
retire(To, Pid, Done) ->
    case ets:lookup(?TAB, To) of
        [{_, Pid, Done}] ->
            true = ets:delete(?TAB, To),
            Pid ! retire,
            ok;
        _ ->
            ok
    end.

start(To, Owner) ->
    logger:update_process_metadata(#{domain => [erlcuda]}),
    Ref = monitor(process, Owner),
    loop(To, Owner, Ref, 0).

loop(To, Owner, Ref, Done) ->
    receive
        {send, Message} -> To ! Message, loop(To, Owner, Ref, Done + 1);
        {run, Fun} -> run(Fun), loop(To, Owner, Ref, Done + 1);
        retire -> ok;
        {'DOWN', Ref, process, Owner, _} -> drain(To)
    after 0 ->
        Owner ! {erlcuda_delivery, retire, To, self(), Done},
        receive
            {send, Message} -> To ! Message, loop(To, Owner, Ref, Done + 1);
            {run, Fun} -> run(Fun), loop(To, Owner, Ref, Done + 1);
            retire -> ok;
            {'DOWN', Ref, process, Owner, _} -> drain(To)
        end
    end.

%% A bug in one delivery must not stop the ones queued behind it.
run(Fun) ->
    try Fun()
    catch Class:Why:Stack ->
            ?LOG_ERROR("erlcuda: a delivery failed: ~0p", [{Class, Why, Stack}])
    end.

%% The port owner is gone: nothing more can come; finish what was given.
drain(To) ->
    receive
        {send, Message} -> To ! Message, drain(To);
        {run, Fun} -> run(Fun), drain(To)
    after 0 ->
        ok
    end.
