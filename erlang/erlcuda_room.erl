%% @private
%% The waiting room: launches with `{wait, Ms}' that find their device's queue full
%% (`max_queue' jobs in flight) wait here, in the order they came, until a place is free or
%% their time is up.
%%
%% A waiter counts itself in on its device (`erlcuda_status:add_waiting/3', done by this
%% process) before it tries once more for a place, so a job that leaves the queue after that
%% try sees it and tells this process (`erlcuda_status:dequeue/2' sends
%% `{erlcuda_room, room, Queues, Device}'); a queue nobody waits on pays only the read of
%% that count. Told, the room gives free places to its first waiters, one place each
%% (`{erlcuda_room, Ref, granted}'); the waiter answers that it took it, and from then its
%% job owns the place as any other's. A waiter that gives up is answered `cancelled' unless
%% its grant went first (then it has the place after all); a waiter that dies loses its
%% turn, and a place granted to it and never taken is given back. Launches without the
%% option never wait: they find a place or are `overloaded' at once, as before.
-module(erlcuda_room).
-behaviour(gen_server).

-export([start_link/0, enqueue/3]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2]).

-record(waiter, {pid :: pid(),
                 monitor :: reference(),
                 key :: key(),
                 max :: pos_integer(),
                 granted = false :: boolean()}).

-type key() :: {erlcuda_status:queues(), non_neg_integer()}.

-record(state, {lines = #{} :: #{key() => queue:queue(reference())},
                waiters = #{} :: #{reference() => #waiter{}},
                %% a waiter's monitor to its reference
                monitors = #{} :: #{reference() => reference()}}).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Count a job in on `Device', waiting (in the caller) for a place until `Deadline'
%% (monotonic milliseconds, or `infinity') when the queue is full: `overloaded' when the
%% time runs out first. Runs in the launching process.
-spec enqueue(erlcuda_status:status(), non_neg_integer(), erlcuda_await:deadline()) ->
    ok | overloaded.
enqueue(#{queues := Queues} = Status, Device, Deadline) ->
    %% With others waiting already, this launch waits behind them.
    case erlcuda_status:waiting(Queues, Device) =:= 0
         andalso erlcuda_status:enqueue(Status, Device) of
        ok -> ok;
        _ -> wait(Status, Device, Deadline)
    end.

wait(#{queues := Queues, max_queue := Max}, Device, Deadline) ->
    case whereis(?MODULE) of
        undefined ->
            overloaded;
        Room ->
            Ref = monitor(process, Room),
            Room ! {?MODULE, wait, Ref, self(), {Queues, Device}, Max},
            receive
                {?MODULE, Ref, granted} -> taken(Room, Ref);
                {'DOWN', Ref, process, _, _} -> overloaded
            after erlcuda_await:remaining(Deadline) ->
                Room ! {?MODULE, cancel, Ref},
                receive
                    {?MODULE, Ref, granted} -> taken(Room, Ref);
                    {?MODULE, Ref, cancelled} -> demonitor(Ref, [flush]), overloaded;
                    {'DOWN', Ref, process, _, _} -> overloaded
                end
            end
    end.

taken(Room, Ref) ->
    demonitor(Ref, [flush]),
    Room ! {?MODULE, taken, Ref},
    ok.

%% gen_server.

-spec init([]) -> {ok, #state{}}.
init([]) ->
    logger:update_process_metadata(#{domain => [erlcuda]}),
    %% The waiters of a room that ended went with it.
    ok = erlcuda_status:clear_waiting(),
    {ok, #state{}}.

-spec handle_call(term(), gen_server:from(), #state{}) ->
    {reply, {error, unknown_call}, #state{}}.
handle_call(_, _, State) ->
    {reply, {error, unknown_call}, State}.

-spec handle_cast(term(), #state{}) -> {noreply, #state{}}.
handle_cast(_, State) ->
    {noreply, State}.

-spec handle_info(term(), #state{}) -> {noreply, #state{}}.
handle_info({?MODULE, wait, Ref, Pid, {Queues, Device} = Key, Max}, State)
  when is_reference(Ref), is_pid(Pid) ->
    Waiter = #waiter{pid = Pid, monitor = monitor(process, Pid), key = Key, max = Max},
    %% Counted in before the try below: a place freed from now on comes here.
    ok = erlcuda_status:add_waiting(Queues, Device, 1),
    #state{lines = Lines, waiters = Waiters, monitors = Monitors} = State,
    Line = maps:get(Key, Lines, queue:new()),
    State1 = State#state{lines = Lines#{Key => queue:in(Ref, Line)},
                         waiters = Waiters#{Ref => Waiter},
                         monitors = Monitors#{Waiter#waiter.monitor => Ref}},
    {noreply, serve(Key, State1)};
handle_info({?MODULE, room, Queues, Device}, State) ->
    {noreply, serve({Queues, Device}, State)};
handle_info({?MODULE, cancel, Ref}, #state{waiters = Waiters} = State) ->
    case Waiters of
        #{Ref := #waiter{granted = false, pid = Pid}} ->
            Pid ! {?MODULE, Ref, cancelled},
            {noreply, forget(Ref, State)};
        #{} ->
            %% Granted: the grant reached the waiter first.
            {noreply, State}
    end;
handle_info({?MODULE, taken, Ref}, State) ->
    {noreply, forget(Ref, State)};
handle_info({'DOWN', Mon, process, _, _}, #state{monitors = Monitors, waiters = Waiters} = State) ->
    case Monitors of
        #{Mon := Ref} ->
            case Waiters of
                #{Ref := #waiter{granted = true, key = {Queues, Device}}} ->
                    %% A place it never took: free for the next.
                    ok = erlcuda_status:dequeue(Queues, Device);
                #{} ->
                    ok
            end,
            {noreply, forget(Ref, State)};
        #{} ->
            {noreply, State}
    end;
handle_info(_, State) ->
    {noreply, State}.

%% Places for the first waiters of `Key' while there are free ones.
serve(Key, #state{lines = Lines} = State) ->
    case queue:peek(maps:get(Key, Lines, queue:new())) of
        {value, Ref} -> serve(Key, Ref, State);
        empty -> State
    end.

serve({Queues, Device} = Key, Ref, #state{lines = Lines, waiters = Waiters} = State) ->
    #{Ref := #waiter{pid = Pid, max = Max} = Waiter} = Waiters,
    case erlcuda_status:take(Queues, Device, Max) of
        true ->
            Pid ! {?MODULE, Ref, granted},
            ok = erlcuda_status:add_waiting(Queues, Device, -1),
            {{value, Ref}, Line} = queue:out(maps:get(Key, Lines)),
            serve(Key, State#state{lines = put_line(Key, Line, Lines),
                                   waiters = Waiters#{Ref := Waiter#waiter{granted = true}}});
        false ->
            State
    end.

%% A waiter gone: out of its line (and out of the count) if it still waited, and forgotten.
forget(Ref, #state{lines = Lines, waiters = Waiters, monitors = Monitors} = State) ->
    case maps:take(Ref, Waiters) of
        {#waiter{monitor = Mon, granted = Granted, key = {Queues, Device} = Key}, Rest} ->
            demonitor(Mon, [flush]),
            Lines1 = case Granted of
                         true ->
                             Lines;
                         false ->
                             ok = erlcuda_status:add_waiting(Queues, Device, -1),
                             put_line(Key, queue:delete(Ref, maps:get(Key, Lines)), Lines)
                     end,
            State#state{lines = Lines1, waiters = Rest, monitors = maps:remove(Mon, Monitors)};
        error ->
            State
    end.

put_line(Key, Line, Lines) ->
    case queue:is_empty(Line) of
        true -> maps:remove(Key, Lines);
        false -> Lines#{Key => Line}
    end.
