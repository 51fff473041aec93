%% @private
%% erlcuda's event process: it runs the telemetry handlers of the events that no waiting
%% process can run (erlcuda_telemetry says which), so that a slow or blocked handler holds
%% up other events only, never a reply. The port owner, its deliverers and the sweep of dead
%% callers only send it a message, and only for a job that had listeners as it started or,
%% for worker events, while someone listens. It drops nothing: what it is sent waits in its
%% mailbox for a handler that blocks, and what is there when it is stopped (after the port
%% owner, which sends the last of them) is run first.
-module(erlcuda_events).
-behaviour(gen_server).

-export([start_link/0, job_stop/2, worker/3]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc A job answered `Result' (its reply already sent) by the process calling this: its
%% stop or exception event, run by the event process. Nothing at all for a job nobody
%% listened to.
-spec job_stop(erlcuda_telemetry:span(), term()) -> ok.
job_stop(none, _) ->
    ok;
job_stop(Span, Result) ->
    %% Only what the event needs travels: not a result's value.
    Outcome = case Result of
                  {error, _} -> Result;
                  _ -> ok
              end,
    send({job_stop, Span, Outcome, erlang:monotonic_time()}).

%% @doc `[erlcuda, worker, Event]', run by the event process, when someone listens.
-spec worker(start | down | restart | stop, map(), map()) -> ok.
worker(Event, Measurements, Meta) ->
    case erlcuda_telemetry:listening([erlcuda, worker]) of
        true -> send({event, [erlcuda, worker, Event],
                      Measurements#{system_time => erlang:system_time()}, Meta});
        false -> ok
    end.

send(Message) ->
    case whereis(?MODULE) of
        undefined -> ok;
        Pid -> Pid ! Message, ok
    end.

%% gen_server.

-spec init([]) -> {ok, #{}}.
init([]) ->
    %% Stopped with the application: terminate/2 runs what is left.
    process_flag(trap_exit, true),
    logger:update_process_metadata(#{domain => [erlcuda]}),
    {ok, #{}}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, {error, unknown_call}, map()}.
handle_call(_, _, State) ->
    {reply, {error, unknown_call}, State}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(_, State) ->
    {noreply, State}.

-spec handle_info(term(), map()) -> {noreply, map()}.
handle_info(Message, State) ->
    run(Message),
    {noreply, State}.

-spec terminate(term(), map()) -> ok.
terminate(_, _) ->
    drain().

run({job_stop, Span, Outcome, At}) ->
    erlcuda_telemetry:job_stop(Span, Outcome, At);
run({event, Event, Measurements, Meta}) ->
    erlcuda_telemetry:execute(Event, Measurements, Meta);
run(_) ->
    ok.

drain() ->
    receive
        Message -> run(Message), drain()
    after 0 ->
        ok
    end.
