%% @private
%% Who owns which device buffer, and freeing a buffer when its owner dies.
%%
%% Two public tables, created by the application's process so that they outlive this server:
%% one row per buffer (`id -> owner, device, epoch, type, elements') and one per (owner, id)
%% pair (ordered, so an owner's buffers are one range). A launch with `{keep, true}' takes
%% its ids here (`next_ids/1', unique in this node) and registers them to its caller before
%% its frame is written (`register/4', in the caller's process); this server only watches
%% owners: one monitor per owner, and on its 'DOWN' it frees the owner's buffers with a
%% `free' control call written after every launch already written or handed to the port's
%% writer (`erlcuda_writer:control/2'), so a free never overtakes the launch that made the
%% buffer.
%%
%% An owner is watched once: its first registration finds no row for it in the watch table
%% and asks this server to monitor it. The server deletes an owner's watch row before it
%% takes the owner's buffers, so a registration that comes after the take sees no watch row
%% and asks again (a monitor of a dead process fires at once).
%%
%% Every buffer belongs to the worker it was made in (its epoch): when a worker starts, the
%% rows of earlier epochs are dropped (`new_epoch/1'), their memory having gone with their
%% worker. A job whose results were to be kept but that failed leaves no row behind
%% (`abandon/3').
-module(erlcuda_buffers).
-behaviour(gen_server).

-export([create/0, start_link/0, is_buffer/1, next_ids/1, register/4, check/2, settle/1, abandon/3,
         free/1, free/2, free_all/1, give/2, give/3, watch_now/1, info/1, verify/1,
         new_epoch/1, count/0]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-export_type([id/0]).

-include_lib("kernel/include/logger.hrl").

-type id() :: pos_integer().

-define(IDS, erlcuda_buffer_ids).
-define(OWNED, erlcuda_buffer_owned).
-define(WATCHED, erlcuda_buffer_watched).
-define(COUNTER, {?MODULE, ids}).
%% Ids per free frame at most: an owner of a million buffers frees them in bounded frames.
-define(FREE_CHUNK, 65536).

-record(buf, {id :: id(),
              owner :: pid(),
              device :: non_neg_integer(),
              epoch :: non_neg_integer(),
              type :: erlcuda_vector:type() | undefined,
              elements :: non_neg_integer() | undefined}).

%% @doc The tables; created by the application's process so that they outlive the server.
%% The id counter lives as long as the node: ids of an earlier start never come back.
-spec create() -> ok.
create() ->
    ?IDS = ets:new(?IDS, [set, public, named_table, {keypos, #buf.id},
                          {write_concurrency, true}, {read_concurrency, true}]),
    ?OWNED = ets:new(?OWNED, [ordered_set, public, named_table, {write_concurrency, true}]),
    case persistent_term:get(?COUNTER, undefined) of
        undefined -> persistent_term:put(?COUNTER, atomics:new(1, [{signed, false}]));
        _ -> ok
    end.

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc `N' new buffer ids.
-spec next_ids(non_neg_integer()) -> [id()].
next_ids(0) ->
    [];
next_ids(N) ->
    Last = atomics:add_get(persistent_term:get(?COUNTER), 1, N),
    lists:seq(Last - N + 1, Last).

%% @doc Register buffers-to-be to `Owner' (the caller of the launch that keeps them).
-spec register(pid(), non_neg_integer(), non_neg_integer(), [id()]) -> ok.
register(_, _, _, []) ->
    ok;
register(Owner, Device, Epoch, Ids) ->
    true = ets:insert(?IDS, [#buf{id = Id, owner = Owner, device = Device, epoch = Epoch}
                             || Id <- Ids]),
    true = ets:insert(?OWNED, [{{Owner, Id}} || Id <- Ids]),
    watch(Owner).

%% @doc `ok' when every buffer is of the worker now running (`Epoch') and still held;
%% else the first that is not.
-spec check([erlcuda:buffer()], non_neg_integer()) ->
    ok | {error, {buffer_lost, erlcuda:buffer()} | {bad_args, binary()}}.
check([], _) ->
    ok;
check([{erlcuda_buffer, _, Epoch, _, Id, _, _} = B | Rest], Epoch) ->
    case ets:lookup(?IDS, Id) of
        [Buf] ->
            case same(B, Buf) of
                true -> check(Rest, Epoch);
                false -> forged(B)
            end;
        [] ->
            {error, {buffer_lost, B}}
    end;
check([B | _], _) ->
    {error, {buffer_lost, B}}.

%% @doc A kept job's reply: note the type and size of the buffers it made.
-spec settle(term()) -> ok.
settle({erlcuda_buffer, _, _, _, Id, Type, Elements}) ->
    _ = ets:update_element(?IDS, Id, [{#buf.type, Type}, {#buf.elements, Elements}]),
    ok;
settle({buffer, B}) ->
    settle(B);
settle(List) when is_list(List) ->
    lists:foreach(fun settle/1, List);
settle(_) ->
    ok.

%% @doc Whether a term is a buffer handle (of any node or epoch).
-spec is_buffer(term()) -> boolean().
is_buffer({erlcuda_buffer, Node, Epoch, Device, Id, Type, Elements})
  when is_atom(Node), is_integer(Epoch), is_integer(Device), Device >= 0, is_integer(Id),
       is_atom(Type), is_integer(Elements), Elements >= 0 ->
    erlcuda_vector:is_type(Type);
is_buffer(_) ->
    false.

%% @doc A job that was to keep results under `Ids' failed (or was never written): drop the
%% registrations and free whatever the worker might hold under them.
-spec abandon(non_neg_integer(), non_neg_integer(), [id()]) -> ok.
abandon(_, _, []) ->
    ok;
abandon(Epoch, Device, Ids) ->
    Held = [Id || Id <- Ids, take(Id) =/= none],
    send_free(Epoch, Device, Held).

%% @doc Free a buffer now; only its owner may. A buffer already freed or lost is `ok'.
-spec free(term()) -> ok | {error, erlcuda:reason()}.
free(Buffer) ->
    free(Buffer, self()).

%% @doc `free/1' on behalf of `Caller' (a caller of another node: erlcuda_remote).
-spec free(term(), pid()) -> ok | {error, erlcuda:reason()}.
free(Buffer, Caller) ->
    case lookup(Buffer) of
        {ok, #buf{owner = Owner, id = Id, device = Device, epoch = Epoch}} when Owner =:= Caller ->
            _ = take(Id),
            send_free(Epoch, Device, [Id]);
        {ok, _} -> {error, not_owner};
        gone -> ok;
        {error, _} = Error -> Error
    end.

%% @doc Free the caller's buffers found in a term (a reply nobody will read).
-spec free_all(term()) -> ok.
free_all(Term) when is_tuple(Term) ->
    case is_buffer(Term) of
        true -> _ = free(Term), ok;
        false -> free_all(tuple_to_list(Term))
    end;
free_all(List) when is_list(List) ->
    lists:foreach(fun free_all/1, List);
free_all(_) ->
    ok.

%% @doc Hand a buffer to another process (of any node: a lost connection to it frees the
%% buffer as its exit would); only its owner may.
-spec give(term(), term()) -> ok | {error, erlcuda:reason()}.
give(Buffer, Pid) ->
    give(Buffer, Pid, self()).

%% @doc `give/2' on behalf of `Caller' (a caller of another node: erlcuda_remote).
-spec give(term(), term(), pid()) -> ok | {error, erlcuda:reason()}.
give(Buffer, Pid, Caller) when is_pid(Pid), node(Pid) =:= node() ->
    case is_process_alive(Pid) of
        true -> give_alive(Buffer, Pid, Caller);
        false -> {error, {bad_args, iolist_to_binary(io_lib:format(
                                                         "give: ~0p is not alive", [Pid]))}}
    end;
give(Buffer, Pid, Caller) when is_pid(Pid) ->
    give_alive(Buffer, Pid, Caller);
give(_, Pid, _) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("give: ~0P is not a process",
                                                      [Pid, 8]))}}.

give_alive(Buffer, Pid, Caller) ->
    case lookup(Buffer) of
        {ok, #buf{owner = Owner}} when Owner =:= Pid ->
            ok;
        {ok, #buf{owner = Owner, id = Id}} when Owner =:= Caller ->
            %% The new owner's row first: the buffer is never without an owner.
            true = ets:insert(?OWNED, {{Pid, Id}}),
            case ets:update_element(?IDS, Id, {#buf.owner, Pid}) of
                true ->
                    true = ets:delete(?OWNED, {Owner, Id}),
                    watch(Pid);
                false ->
                    %% Freed meanwhile (the new owner's death was being handled, or a
                    %% free raced this give): nothing to hand over.
                    true = ets:delete(?OWNED, {Pid, Id}),
                    {error, {buffer_lost, Buffer}}
            end;
        {ok, _} -> {error, not_owner};
        gone -> {error, {buffer_lost, Buffer}};
        {error, _} = Error -> Error
    end.

%% @doc `Owner''s death, or the loss of the connection to it, frees its buffers from now
%% on: its monitor is set when this returns (a give sets it a moment later).
-spec watch_now(pid()) -> ok.
watch_now(Owner) when is_pid(Owner) ->
    gen_server:call(?MODULE, {watch, Owner}, infinity).

%% @doc What a handle says, with its owner (`undefined' once it is freed or lost).
-spec info(term()) -> map() | {error, erlcuda:reason()}.
info({erlcuda_buffer, Node, Epoch, Device, Id, Type, Elements} = B) ->
    case is_buffer(B) of
        true ->
            Owner = case Node =:= node() of
                        true -> case lookup(B) of
                                    {ok, #buf{owner = O}} -> O;
                                    {error, {bad_args, _}} = Forged -> Forged;
                                    _ -> undefined
                                end;
                        false -> undefined
                    end,
            case Owner of
                {error, _} ->
                    Owner;
                _ ->
                    #{node => Node, epoch => Epoch, device => Device, id => Id, type => Type,
                      elements => Elements, bytes => Elements * erlcuda_vector:size(Type),
                      owner => Owner}
            end;
        false ->
            not_a_buffer(B)
    end;
info(Other) ->
    not_a_buffer(Other).

%% @doc A new worker started: the buffers of earlier ones are gone.
-spec new_epoch(non_neg_integer()) -> ok.
new_epoch(Epoch) ->
    gen_server:cast(?MODULE, {new_epoch, Epoch}).

%% @doc Buffers registered on this node.
-spec count() -> non_neg_integer().
count() ->
    try ets:info(?IDS, size) of
        N when is_integer(N) -> N;
        _ -> 0
    catch error:badarg -> 0
    end.

%% @doc `ok' for a handle of a buffer this node holds, as erlcuda made it; else why not.
-spec verify(term()) -> ok | {error, erlcuda:reason()}.
verify(B) ->
    try lookup(B) of
        {ok, _} -> ok;
        gone -> {error, {buffer_lost, B}};
        {error, _} = Error -> Error
    catch
        error:badarg -> ok  % no tables: erlcuda is not running, which submit answers
    end.

%% The row of a local, current buffer: `gone' when it is freed, lost or of an earlier
%% worker.
lookup({erlcuda_buffer, Node, Epoch, _, Id, _, _} = B) ->
    case is_buffer(B) of
        false -> not_a_buffer(B);
        true when Node =/= node() -> {error, {remote_buffer, B}};
        true ->
            case ets:lookup(?IDS, Id) of
                [#buf{epoch = Epoch} = Buf] ->
                    case same(B, Buf) of
                        true -> {ok, Buf};
                        false -> forged(B)
                    end;
                _ -> gone
            end
    end;
lookup(Other) ->
    not_a_buffer(Other).

%% A handle is only read, never trusted: its device, and once the worker said them its
%% type and length, must be the buffer's own.
same({erlcuda_buffer, _, _, Device, _, Type, Elements}, #buf{device = Device, type = T,
                                                               elements = N}) ->
    T =:= undefined orelse (T =:= Type andalso N =:= Elements);
same(_, _) ->
    false.

forged(B) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("not the handle erlcuda made for "
                                                      "this buffer: ~0P", [B, 12]))}}.

not_a_buffer(Term) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("not a buffer: ~0P", [Term, 8]))}}.

%% Drop a buffer's rows; its row, or `none' if it had none.
take(Id) ->
    case ets:take(?IDS, Id) of
        [#buf{owner = Owner} = Buf] ->
            true = ets:delete(?OWNED, {Owner, Id}),
            Buf;
        [] ->
            none
    end.

watch(Owner) ->
    case catch ets:member(?WATCHED, Owner) of
        true -> ok;
        _ -> gen_server:cast(?MODULE, {watch, Owner})
    end.

%% The free goes the way launches go, and only to the worker that made the buffers.
send_free(_, _, []) ->
    ok;
send_free(Epoch, Device, Ids) when length(Ids) > ?FREE_CHUNK ->
    {Chunk, Rest} = lists:split(?FREE_CHUNK, Ids),
    ok = send_free(Epoch, Device, Chunk),
    send_free(Epoch, Device, Rest);
send_free(Epoch, Device, Ids) ->
    erlcuda_writer:control(Epoch, erlcuda_protocol:encode_call(0, free, [Device, Ids])).

%% gen_server: the owners' monitors.

-spec init([]) -> {ok, #{}}.
init([]) ->
    logger:update_process_metadata(#{domain => [erlcuda]}),
    ?WATCHED = ets:new(?WATCHED, [set, protected, named_table, {read_concurrency, true}]),
    %% A restarted server watches the owners its predecessor watched.
    Owners = lists:usort(ets:select(?OWNED, [{{{'$1', '_'}}, [], ['$1']}])),
    lists:foreach(fun start_watch/1, Owners),
    {ok, #{}}.

-spec handle_call(term(), gen_server:from(), map()) ->
    {reply, ok | {error, unknown_call}, map()}.
handle_call({watch, Owner}, _, State) when is_pid(Owner) ->
    start_watch(Owner),
    {reply, ok, State};
handle_call(_, _, State) ->
    {reply, {error, unknown_call}, State}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast({watch, Owner}, State) ->
    start_watch(Owner),
    {noreply, State};
handle_cast({new_epoch, Epoch}, State) ->
    Old = ets:select(?IDS, [{pattern([{#buf.id, '$1'}, {#buf.owner, '$2'},
                                      {#buf.epoch, '$3'}]),
                             [{'<', '$3', Epoch}], [{{'$1', '$2'}}]}]),
    lists:foreach(fun({Id, Owner}) ->
                          true = ets:delete(?IDS, Id),
                          true = ets:delete(?OWNED, {Owner, Id})
                  end, Old),
    {noreply, State};
handle_cast(_, State) ->
    {noreply, State}.

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info({'DOWN', _, process, Owner, _}, State) ->
    %% The watch row goes first: see the module's doc.
    true = ets:delete(?WATCHED, Owner),
    free_owned(Owner),
    {noreply, State};
handle_info(_, State) ->
    {noreply, State}.

%% A match pattern for #buf{}: the record's fields typed for dialyzer cannot hold '_'.
pattern(Fields) ->
    erlang:make_tuple(record_info(size, buf), '_', [{1, buf} | Fields]).

start_watch(Owner) ->
    case ets:member(?WATCHED, Owner) of
        true -> ok;
        false ->
            true = ets:insert(?WATCHED, {Owner, monitor(process, Owner)}),
            ok
    end.

%% Everything a dead owner held, freed by worker and device.
free_owned(Owner) ->
    Ids = ets:select(?OWNED, [{{{Owner, '$1'}}, [], ['$1']}]),
    Bufs = [Buf || Id <- Ids, #buf{} = Buf <- [take(Id)]],
    Groups = lists:foldl(fun(#buf{epoch = E, device = D, id = Id}, Acc) ->
                                 maps:update_with({E, D}, fun(L) -> [Id | L] end, [Id], Acc)
                         end, #{}, Bufs),
    _ = [send_free(E, D, lists:reverse(L)) || {{E, D}, L} <- maps:to_list(Groups)],
    case Bufs of
        [] -> ok;
        _ -> ?LOG_DEBUG("erlcuda: freed ~b buffers of ~p", [length(Bufs), Owner])
    end.
