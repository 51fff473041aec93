%% @private
%% The port owner: the life cycle of the Python worker process as a state machine.
%%
%%   backing_off --(timer)--> starting --(hello answered)--> [replaying] --> ready
%%     ^   |   ^                 |  |                              |           |
%%     |   |   +-- worker exits, hello or replay times out, stuck -+-----------+
%%     |   |                     |
%%     |   +-(bad_python)--> probing <-(exits before its hello)
%%     +----(verdict)-----------+ (a Python that is fine now: starting)
%%
%% A worker that exits before its hello is explained by the probe of its interpreter
%% (`erlcuda_python'): a Python that cannot serve (not found, too old, no numpy, no erlcuda
%% package) is `{bad_python, Detail}', logged once, answered to every launch and shown by
%% `info/0'; while it stays so, each retry runs the probe alone, not the worker. With
%% `{on_bad_python, fail}' the application's start fails with it instead.
%%
%% Starts that keep failing back off, the delay doubling from ?MIN_BACKOFF up to
%% ?MAX_START_BACKOFF while no worker answers its hello, and up to ?MAX_BACKOFF for a
%% worker that did (and so may be answering jobs again soon).
%%
%% Each start takes a new epoch (erlcuda_status:next_epoch/0): buffers of earlier workers
%% are gone. When user modules were loaded (erlcuda_catalogue), the new worker loads them
%% again before it takes jobs: the port is published only once every replayed load has
%% answered (`replaying'); with none, it is published as soon as it exists. On the first
%% start of the application, with `shm_threshold' `auto', the transports are measured
%% (`measuring', erlcuda_transports) before the application is ready; later workers keep the
%% figure, or the default where the measurement failed.
%%
%% Launches never pass through this process (see `erlcuda_submit'). It forwards each
%% result to its caller (a port's output goes to its owner), answers control calls, and when
%% the worker dies it answers every job still registered with `{worker_down, Why}' and
%% starts a new worker, backing off while starts keep failing. The hello is one more event:
%% nothing here waits in a receive, so `info/0' answers in every state.
-module(erlcuda_worker).
-behaviour(gen_statem).

%% API.
-export([start_link/0, await_ready/1, info/0, call/3]).

%% gen_statem.
-export([init/1, callback_mode/0, handle_event/4, terminate/3]).

-include_lib("kernel/include/logger.hrl").

-define(MIN_BACKOFF, 100).
-define(MAX_BACKOFF, 5000).
-define(MAX_START_BACKOFF, 60000).
%% A worker that lives this long is healthy: its next crash restarts it at once.
-define(STABLE_MS, 10000).
%% How long info/0 waits for a busy worker before answering with this side's view.
-define(INFO_WAIT, 2000).
%% How often dead callers' jobs are swept, at most.
-define(SWEEP_MS, 1000).
%% How long a worker may take to exit once its input is closed, before it is killed.
-define(REAP_MS, 2000).
%% The size from which vectors go through shared memory until the transports are measured.
-define(DEFAULT_THRESHOLD, 1048576).
%% How long measuring the transports may take before the application is ready without it:
%% well within the margin the application's start gives the first worker beyond its
%% start_timeout.
-define(MEASURE_MS, 4000).

-type state() :: starting | replaying | measuring | ready | backing_off | probing.
%% Why the probe runs: to explain a worker's exit before its hello (`Why', its OS pid), or
%% to see whether a bad Python is fixed.
-type purpose() :: {explain, term(), integer() | undefined} | recheck.
-type caller() :: {info, gen_statem:from()} | {plain, gen_statem:from()} | hello
                | {replay, atom()}.

%% The worker's exit status for a command line it refuses (python/erlcuda/cli.py).
-define(EXIT_USAGE, 2).

-record(data, {config :: erlcuda_config:config(),
               port :: port() | undefined,
               os_pid :: integer() | undefined,
               started = 0 :: integer(),
               calls = #{} :: #{pos_integer() => caller()},
               next_call = 1 :: pos_integer(),
               hello = #{} :: map(),
               restarts = 0 :: non_neg_integer(),
               backoff = 0 :: non_neg_integer(),
               down_reason :: term(),
               last_frame = 0 :: integer(),
               %% what the port sent of a frame not yet whole
               reader = erlcuda_protocol:reader() :: erlcuda_protocol:reader(),
               busy_since :: integer() | undefined,
               writer :: {pid(), erlcuda_writer:counters()} | undefined,
               shm = none :: erlcuda_shm:folder() | none,
               epoch = 0 :: non_neg_integer(),
               waiting = [] :: [gen_statem:from()],
               %% the probe of the interpreter while it runs: its port, its OS pid, the
               %% output so far, and why it runs
               probe :: {port(), integer() | undefined, binary(), purpose()} | undefined,
               %% the measurement of the transports while it runs (its reference), and its
               %% threshold and figures, or why it failed: measured once a start
               measuring :: reference() | undefined,
               measured :: {pos_integer(), [erlcuda_transports:figure()]} | {failed, term()}
                         | undefined,
               %% the bad_python detail last logged (each is logged once)
               python_bad :: binary() | undefined,
               %% whether the last worker answered its hello
               answered = false :: boolean(),
               %% the in-flight counts seen off zero at the ticks with no job registered
               %% (erlcuda_status:settle/2)
               unsettled = #{} :: erlcuda_status:seen()}).

%% API.

-spec start_link() -> gen_statem:start_ret().
start_link() ->
    gen_statem:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc Return once the first start of the worker has ended, answered or failed; an error
%% where that start should fail the application's.
-spec await_ready(timeout()) ->
    ok | {error, {bad_config, worker_args, [string()], binary()} | {bad_python, binary()}}.
await_ready(Timeout) ->
    gen_statem:call(?MODULE, await_ready, Timeout).

%% @doc The worker's report merged with this side's view of it.
-spec info() -> map().
info() ->
    gen_statem:call(?MODULE, info, ?INFO_WAIT * 5).

%% @doc A control call into the worker (`Fun' is one of its control functions).
-spec call(atom(), list(), timeout()) -> {ok, term()} | {error, term()}.
call(Fun, Args, Timeout) ->
    gen_statem:call(?MODULE, {call, Fun, Args}, Timeout).

%% gen_statem.

-spec callback_mode() -> gen_statem:callback_mode_result().
callback_mode() ->
    handle_event_function.

-spec init([]) -> gen_statem:init_result(state()).
init([]) ->
    process_flag(trap_exit, true),
    %% Every event this process logs is erlcuda's, for handlers and filters by domain.
    logger:update_process_metadata(#{domain => [erlcuda]}),
    ok = erlcuda_protocol:load_atoms(),
    ok = erlcuda_delivery:init(),
    %% A predecessor killed without its terminate/3 may have left its worker running, and
    %% its jobs have no worker any more.
    kill(erlcuda_status:worker_os_pid()),
    ok = erlcuda_jobs:fail_all(server_restarted),
    {ok, Config} = erlcuda_config:load(),
    self() ! tick,
    {ok, backing_off, #data{config = Config}, [{next_event, internal, start}]}.

-spec handle_event(gen_statem:event_type(), term(), state(), #data{}) ->
    gen_statem:event_handler_result(state()).
handle_event({call, From}, Request, State, D) ->
    request(Request, From, State, D);
%% The worker process.
handle_event(internal, start, backing_off, D) ->
    start_worker(D);
handle_event(state_timeout, restart, backing_off, #data{down_reason = {bad_python, _}} = D) ->
    probe(recheck, reload(D));
handle_event(state_timeout, restart, backing_off, D) ->
    start_worker(D);
%% The probe of the interpreter.
handle_event(info, {Port, {data, Bytes}}, probing,
             #data{probe = {Port, OsPid, Output, Purpose}} = D) ->
    Kept = binary:part(<<Output/binary, Bytes/binary>>, 0,
                       min(byte_size(Output) + byte_size(Bytes), erlcuda_python:max_output())),
    {keep_state, D#data{probe = {Port, OsPid, Kept, Purpose}}};
handle_event(info, {Port, {exit_status, Status}}, probing,
             #data{probe = {Port, _, Output, Purpose}, config = Config} = D) ->
    probed(erlcuda_python:verdict(erlcuda_python:choice(Config), Config, Status, Output),
           Purpose, D#data{probe = undefined});
handle_event(state_timeout, probe_timeout, probing, #data{probe = {Port, OsPid, _, Purpose}} = D) ->
    ?LOG_WARNING("erlcuda: the check of the worker's Python did not end in time"),
    stop_probe(Port, OsPid),
    probed(ok, Purpose, D#data{probe = undefined});
handle_event(state_timeout, hello_timeout, starting, #data{os_pid = OsPid} = D) ->
    ?LOG_ERROR("erlcuda: the worker ~p did not answer its hello in time; killing it",
               [OsPid]),
    kill_worker(start_timeout, D);
handle_event(state_timeout, measure_timeout, measuring, D) ->
    measured({error, timeout}, D#data{measuring = undefined});
handle_event(info, {erlcuda_transports, Ref, Result}, measuring, #data{measuring = Ref} = D) ->
    measured(Result, D#data{measuring = undefined});
handle_event(state_timeout, replay_timeout, replaying, #data{os_pid = OsPid} = D) ->
    ?LOG_ERROR("erlcuda: the worker ~p did not load the user modules again in time; "
               "killing it", [OsPid]),
    kill_worker(replay_timeout, D);
handle_event(info, {Port, {data, Bytes}}, State, #data{port = Port} = D) ->
    data(Bytes, State, D);
handle_event(internal, {frame, Port, Frame}, State, #data{port = Port} = D) ->
    frame(erlcuda_protocol:decode(Frame), State, D);
handle_event(internal, {frame, _, _}, _, _) ->
    %% of a worker that died since
    keep_state_and_data;
handle_event(info, {Port, {exit_status, Status}}, starting, #data{port = Port} = D) ->
    case exit_reason(Status, starting, D) of
        %% It never answered: its interpreter may be what failed.
        {exit_status, _} = Why -> probe({explain, Why, D#data.os_pid}, down(Why, D));
        Why -> worker_died(Why, D)
    end;
handle_event(info, {Port, {exit_status, Status}}, State, #data{port = Port} = D) ->
    worker_died(exit_reason(Status, State, D), D);
handle_event(info, {'EXIT', Port, Why}, _, #data{port = Port} = D) ->
    worker_died({port_exit, Why}, D);
handle_event(info, {'EXIT', Writer, Why}, _, #data{writer = {Writer, _}} = D) ->
    %% Frames it held are lost: their jobs must fail, so the worker goes too. (stop_writer/1
    %% unlinks first: its own kill never comes here.)
    ?LOG_ERROR("erlcuda: the port's writer died: ~0P", [Why, 20]),
    kill_worker({writer_died, Why}, D);
handle_event(info, {erlcuda_delivery, retire, To, Pid, Done}, _, _) ->
    ok = erlcuda_delivery:retire(To, Pid, Done),
    keep_state_and_data;
handle_event(info, tick, State, #data{config = Config, unsettled = Seen} = D) ->
    _ = erlcuda_jobs:sweep_dead_callers(),
    %% After the jobs of dead callers: a slot such a caller holds now has no job, and a
    %% place in a queue is owed to no job.
    ok = erlcuda_shm_slots:sweep(maps:get(shm_keep_ms, Config)),
    Unsettled = case erlcuda_jobs:size() of
                    0 -> erlcuda_status:settle(Seen, fun() -> erlcuda_jobs:size() =:= 0 end);
                    _ -> #{}
                end,
    _ = erlang:send_after(tick_ms(D), self(), tick),
    watchdog(State, D#data{unsettled = Unsettled});
handle_event(info, {info_timeout, Id}, State, #data{calls = Calls} = D) ->
    case maps:take(Id, Calls) of
        {{info, From}, Rest} ->
            {keep_state, D#data{calls = Rest}, [{reply, From, unanswered_info(State, D)}]};
        _ ->
            keep_state_and_data
    end;
handle_event(_, _, _, _) ->
    %% Late messages of a closed port, replies of `kill', stray messages.
    keep_state_and_data.

%% Callers: the calls of the API, answered in every state.
request(await_ready, From, State, D) when State =:= starting; State =:= replaying;
                                          State =:= measuring; State =:= probing ->
    {keep_state, D#data{waiting = [From | D#data.waiting]}};
request(await_ready, From, _, D) ->
    {keep_state_and_data, [{reply, From, start_result(D)}]};
request(info, From, ready, #data{port = Port} = D) when Port =/= undefined ->
    %% A worker busy with a long control call must not leave info/0 waiting: past
    %% ?INFO_WAIT the answer is this side's view and the counters of the worker's hello.
    Id = D#data.next_call,
    case send_call(info, [], {info, From}, D) of
        {ok, D1} ->
            _ = erlang:send_after(?INFO_WAIT, self(), {info_timeout, Id}),
            {keep_state, D1};
        {error, _} ->
            {keep_state_and_data, [{reply, From, unanswered_info(ready, D)}]}
    end;
request(info, From, State, D) ->
    {keep_state_and_data, [{reply, From, merge_info(#{}, State, D)}]};
request({call, Fun, Args}, From, State, #data{port = Port} = D)
  when Port =/= undefined, State =/= backing_off ->
    case send_call(Fun, Args, {plain, From}, D) of
        {ok, D1} -> {keep_state, D1};
        {error, Why} -> {keep_state_and_data, [{reply, From, {error, Why}}]}
    end;
request({call, _, _}, From, _, #data{down_reason = {bad_python, _} = Bad}) ->
    {keep_state_and_data, [{reply, From, {error, Bad}}]};
request({call, _, _}, From, _, #data{down_reason = Why}) ->
    {keep_state_and_data, [{reply, From, {error, {worker_down, Why}}}]};
request(_, From, _, _) ->
    {keep_state_and_data, [{reply, From, {error, unknown_call}}]}.

-spec terminate(term(), state(), #data{}) -> ok.
terminate(Reason, _State, #data{port = Port, os_pid = OsPid} = D) ->
    ok = erlcuda_status:set_down(stopping),
    ok = erlcuda_status:set_worker_os_pid(undefined),
    ok = erlcuda_events:worker(stop, #{duration => life(D)}, (worker_meta(D))#{reason => Reason}),
    _ = [catch port_close(Port) || Port =/= undefined],
    stop_writer(D#data.writer),
    fail_calls({worker_down, stopping}, stopping, D),
    ok = erlcuda_jobs:fail_all({server_stopped, Reason}),
    %% The worker ends on its own once its input closes (popping its CUDA contexts); one
    %% that does not is killed rather than left behind.
    reap(OsPid, ?REAP_MS div 50),
    _ = remove_folder(D),
    case D#data.probe of
        {Probe, ProbePid, _, _} -> stop_probe(Probe, ProbePid);
        undefined -> ok
    end.

%% The worker's frames.

%% Bytes from the port: a lone whole frame is handled at once, several as events of their
%% own, in order.
data(Bytes, State, #data{port = Port, reader = R} = D0) ->
    D = D0#data{last_frame = now_ms()},
    case erlcuda_protocol:read(Bytes, R) of
        {[Frame], Rest} ->
            %% What the reader holds now must outlive a handler that keeps the state as it
            %% was before this event.
            keeping(frame(erlcuda_protocol:decode(Frame), State, D#data{reader = Rest}),
                    D#data{reader = Rest});
        {Frames, Rest} ->
            {keep_state, D#data{reader = Rest},
             [{next_event, internal, {frame, Port, F}} || F <- Frames]}
    end.

frame({results, Records}, _, #data{os_pid = OsPid} = D) ->
    case erlcuda_protocol:each_result(fun(Id, Reply) -> complete(Id, Reply) end,
                                      Records, erlang:monotonic_time(nanosecond)) of
        ok ->
            {keep_state, D};
        malformed ->
            %% A job whose record broke off would never be answered: the worker is broken,
            %% and its death answers every job still open.
            ?LOG_ERROR("erlcuda: a malformed results frame from worker ~p; killing it",
                       [OsPid]),
            kill_worker({protocol, malformed_results}, D);
        {mismatch, Id} ->
            ?LOG_ERROR("erlcuda: worker ~p answered job ~b with a record that does not fit "
                       "it; killing it", [OsPid, Id]),
            kill_worker({protocol, reply_mismatch}, D)
    end;
frame({answer, Id, Reply}, State, #data{calls = Calls} = D) ->
    case maps:take(Id, Calls) of
        {{info, From}, Rest} ->
            Info = case Reply of {ok, M} when is_map(M) -> M; _ -> #{} end,
            {keep_state, D#data{calls = Rest}, [{reply, From, merge_info(Info, State, D)}]};
        {{plain, From}, Rest} ->
            {keep_state, D#data{calls = Rest}, [{reply, From, Reply}]};
        {hello, Rest} ->
            hello(Reply, D#data{calls = Rest});
        {{replay, Module}, Rest} ->
            replayed(Module, Reply, D#data{calls = Rest});
        error ->
            keep_state_and_data
    end;
frame({log, Level, Text}, _, _) ->
    logger:log(Level, "erlcuda worker: ~ts", [Text], #{domain => [erlcuda]}),
    keep_state_and_data;
frame({unexpected, Term}, _, _) ->
    ?LOG_ERROR("erlcuda: unexpected frame from the worker: ~0P", [Term, 20]),
    keep_state_and_data;
frame({undecodable, Size}, _, _) ->
    ?LOG_ERROR("erlcuda: undecodable frame of ~b bytes from the worker", [Size]),
    keep_state_and_data.

%% A job already answered (its caller died, or it timed out) gave its result slot up as it
%% ended: a result the worker wrote there is nobody's.
complete(Id, Reply) ->
    case erlcuda_jobs:complete(Id, Reply) of
        mismatch -> mismatch;
        _ -> ok
    end.

hello({ok, Info}, #data{os_pid = OsPid} = D0) ->
    D = shm_checked(Info, D0),
    case erlcuda_worker_start:check_hello(Info) of
        ok ->
            ?LOG_NOTICE("erlcuda: worker ~p started: ~ts", [OsPid, maps:get(reason, Info, "")]),
            replay(erlcuda_catalogue:replay(), answered(D#data{hello = Info}));
        {unavailable, Why} ->
            ?LOG_ERROR("erlcuda: worker ~p cannot run jobs: ~ts", [OsPid, Why]),
            ok = erlcuda_status:set_unavailable(Why),
            ready(answered(D#data{hello = Info}));
        {failed, Other} ->
            hello_failed(Other, D)
    end;
hello(Other, D) ->
    hello_failed(Other, D).

%% A worker that could not take its folder (its lock held, the folder gone) says why in its
%% hello: the folder goes, and every job from now on takes the pipe, as with `shm_dir'
%% `none'. The launches written since the port was published may name files in it: the
%% worker answers those with an error. (A full shared-memory dir fails as the folder is
%% made, with its lock file, before the worker starts: all then take the pipe.)
shm_checked(#{shm_unavailable := Why}, #data{shm = #{}, os_pid = OsPid, port = Port} = D) ->
    ?LOG_WARNING("erlcuda: worker ~p has no shared memory, large data goes through the "
                 "port: ~ts", [OsPid, Why]),
    ok = erlcuda_status:drop_shm(Port),
    remove_folder(D);
shm_checked(_, D) ->
    D.

%% Its interpreter serves: a bad Python found later is logged again.
answered(D) ->
    D#data{answered = true, python_bad = undefined}.

hello_failed(Other, D) ->
    ?LOG_ERROR("erlcuda: the worker's hello failed: ~0P", [Other, 20]),
    kill_worker({hello_failed, Other}, D).

%% The user modules loaded into earlier workers, loaded into this one (all the calls at
%% once: the worker answers them in order) before it is published.
replay([], D) ->
    up(D);
replay(Calls, D) ->
    D1 = lists:foldl(fun({Module, Fun, Args}, Acc) ->
                             case send_call(Fun, Args, {replay, Module}, Acc) of
                                 {ok, Acc1} ->
                                     Acc1;
                                 {error, Why} ->
                                     ?LOG_ERROR("erlcuda: cannot load ~p into the new worker: "
                                                "~0p", [Module, Why]),
                                     Acc
                             end
                     end, D, Calls),
    case replaying(D1) of
        true ->
            {next_state, replaying, D1,
             [{state_timeout, maps:get(start_timeout, D1#data.config), replay_timeout}]};
        false ->
            up(D1)
    end.

replayed(Module, Reply, D) ->
    case Reply of
        {ok, {ok, _}} -> ok;
        Other -> ?LOG_ERROR("erlcuda: loading ~p into the new worker failed: ~0P",
                            [Module, Other, 20])
    end,
    case replaying(D) of
        true -> {keep_state, D};
        false -> up(D)
    end.

replaying(#data{calls = Calls}) ->
    lists:any(fun({replay, _}) -> true; (_) -> false end, maps:values(Calls)).

%% The worker takes jobs from now on; on the application's first start, the transports are
%% measured before it is ready.
up(D) ->
    ok = publish(D),
    case D of
        #data{shm = #{}, measured = undefined, config = #{shm_threshold := auto}} ->
            {next_state, measuring, D#data{measuring = erlcuda_transports:start(self())},
             [{state_timeout, ?MEASURE_MS, measure_timeout}]};
        _ ->
            ready(D)
    end.

publish(#data{port = Port, config = Config, hello = Info} = D) ->
    erlcuda_status:set_up(Port, D#data.writer, maps:get(devices, Info),
                          maps:get(max_queue, Config), D#data.shm, D#data.epoch).

measured({ok, Threshold, Figures}, #data{shm = Shm} = D) ->
    ?LOG_NOTICE("erlcuda: vectors of ~b bytes or more go through shared memory (measured, "
                "median microseconds through the pipe and through shared memory: ~ts)",
                [Threshold, figures(Figures)]),
    D1 = D#data{measured = {Threshold, Figures}, shm = Shm#{threshold := Threshold}},
    ok = publish(D1),
    ready(D1);
measured({error, Why}, D) ->
    ?LOG_WARNING("erlcuda: measuring the transports failed (~0p); vectors of ~b bytes or "
                 "more go through shared memory", [Why, threshold(D)]),
    ready(D#data{measured = {failed, Why}}).

%% One line as text: a term printed with `~0p' is spread over many lines by loggers that
%% format it themselves (Elixir's).
figures(Figures) ->
    lists:join(", ", [io_lib:format("~b bytes ~b and ~b", [Bytes, Pipe, Shm])
                      || {Bytes, Pipe, Shm} <- Figures]).

threshold(#data{shm = #{threshold := T}}) -> T;
threshold(_) -> ?DEFAULT_THRESHOLD.

ready(#data{waiting = Waiting} = D) ->
    ok = erlcuda_events:worker(start, #{duration => life(D)},
                               (worker_meta(D))#{devices => maps:get(devices, D#data.hello, 0),
                                                 status => maps:get(status, erlcuda_status:status()),
                                                 restarts => D#data.restarts}),
    {next_state, ready, D#data{waiting = []}, [{reply, From, ok} || From <- Waiting]}.

%% An event's result, with `D' in place of the data it kept unchanged.
keeping(keep_state_and_data, D) -> {keep_state, D};
keeping(Result, _) -> Result.

%% Starting and stopping the worker.

%% The configuration as it is now: each start reads it again.
reload(#data{config = Previous} = D) ->
    case erlcuda_config:load() of
        {ok, Config} ->
            D#data{config = Config};
        {error, Bad} ->
            ?LOG_ERROR("erlcuda: ignoring a changed setting, ~0p; keeping the previous "
                       "configuration", [Bad]),
            D#data{config = Previous}
    end.

start_worker(D0) ->
    #data{config = Config} = Loaded = reload(D0),
    Epoch = erlcuda_status:next_epoch(),
    ok = erlcuda_buffers:new_epoch(Epoch),
    D = Loaded#data{started = now_ms(), shm = shm_folder(Config, Loaded#data.measured),
                epoch = Epoch, reader = erlcuda_protocol:reader(), answered = false},
    #{python := Python, args := Args, env := Env} =
        erlcuda_worker_start:worker_command(Config, D#data.shm),
    try open_port({spawn_executable, Python},
                  [{args, Args}, {env, Env}, stream, binary, exit_status, nouse_stdio,
                   hide]) of
        Port ->
            {os_pid, OsPid} = erlang:port_info(Port, os_pid),
            ok = erlcuda_status:set_worker_os_pid(OsPid),
            %% Jobs may be written as soon as the port exists (the worker reads them after
            %% its hello): until the hello says otherwise, the last worker's device count
            %% serves, or the configured one.
            Devices = maps:get(devices, D#data.hello, provisional_devices(Config)),
            Writer = erlcuda_writer:start_link(Port),
            %% The hello goes first, while nobody else knows the port: callers' frames could
            %% fill the pipe before the new worker reads it. If it is already closed, its
            %% exit follows.
            {_, D1} = send_call(hello, erlcuda_worker_start:hello_args(), hello,
                                D#data{port = Port, os_pid = OsPid, last_frame = now_ms(),
                                       writer = Writer}),
            %% With modules to load again, the port is published once they are loaded.
            ok = case erlcuda_catalogue:replay() of
                     [] -> erlcuda_status:set_up(Port, Writer, Devices,
                                                 maps:get(max_queue, Config), D#data.shm,
                                                 Epoch);
                     _ -> ok
                 end,
            {next_state, starting, D1,
             [{state_timeout, maps:get(start_timeout, Config), hello_timeout}]}
    catch
        error:Why ->
            case erlcuda_python:spawn_failure(erlcuda_python:choice(Config), Why) of
                none ->
                    ?LOG_ERROR("erlcuda: cannot start the worker ~ts: ~p", [Python, Why]),
                    back_off({spawn_failed, Why}, remove_folder(D));
                Bad ->
                    probed(Bad, {explain, {spawn_failed, Why}, undefined}, remove_folder(D))
            end
    end.

%% The probe of the interpreter (erlcuda_python), in a port of its own: its output and exit
%% are events, as the worker's are.
probe(Purpose, #data{config = Config} = D) ->
    Choice = erlcuda_python:choice(Config),
    case erlcuda_python:command(Config) of
        {ok, #{python := Python, args := Args, env := Env}} ->
            try open_port({spawn_executable, Python},
                          [{args, Args}, {env, Env}, stream, binary, exit_status, use_stdio,
                           stderr_to_stdout, hide]) of
                Port ->
                    OsPid = case erlang:port_info(Port, os_pid) of
                                {os_pid, P} -> P;
                                undefined -> undefined
                            end,
                    {next_state, probing, D#data{probe = {Port, OsPid, <<>>, Purpose}},
                     [{state_timeout, maps:get(start_timeout, Config), probe_timeout}]}
            catch
                error:Why ->
                    probed(case erlcuda_python:spawn_failure(Choice, Why) of
                               none -> ok;
                               Bad -> Bad
                           end, Purpose, D)
            end;
        {error, Why} ->
            ?LOG_WARNING("erlcuda: cannot read the check of the worker's Python: ~p", [Why]),
            probed(ok, Purpose, D)
    end.

%% What the probe found: a bad Python is the reason, logged the first time; else the failure
%% it was to explain stands, or, a bad Python being fixed, the worker starts.
probed({bad_python, Detail} = Bad, _, #data{python_bad = Logged} = D) ->
    _ = [?LOG_ERROR("erlcuda: ~ts", [Detail]) || Detail =/= Logged],
    back_off(Bad, D#data{python_bad = Detail});
probed(ok, {explain, Why, OsPid}, D) ->
    ?LOG_ERROR("erlcuda: worker ~p down: ~p", [OsPid, Why]),
    back_off(Why, D);
probed(ok, recheck, D) ->
    start_worker(D).

stop_probe(Port, OsPid) ->
    catch port_close(Port),
    kill(OsPid).

%% A folder for this worker's shared memory; none (everything through the pipe) where the
%% configured place cannot hold one. Its threshold: the one configured, else the measured.
shm_folder(#{shm_threshold := Configured} = Config, Measured) ->
    Threshold = case {Configured, Measured} of
                    {auto, {T, _}} when is_integer(T) -> T;
                    {auto, _} -> ?DEFAULT_THRESHOLD;
                    {Fixed, _} -> Fixed
                end,
    case shm_base(Config) of
        none -> none;
        Base -> make_folder(Base, Threshold)
    end.

%% auto: /dev/shm where the system has one (Linux), else none.
shm_base(#{shm_dir := auto}) ->
    case filelib:is_dir("/dev/shm") of
        true -> "/dev/shm";
        false -> none
    end;
shm_base(#{shm_dir := Base}) ->
    Base.

make_folder(Base, Threshold) ->
    case erlcuda_shm:folder(Base) of
        {ok, Dir} ->
            #{dir => Dir, threshold => Threshold, keeper => erlcuda_shm_slots:keeper()};
        {error, Why} ->
            ?LOG_WARNING("erlcuda: no shared memory, large data goes through the port: ~0p",
                         [Why]),
            none
    end.

remove_folder(#data{shm = Shm} = D) ->
    case Shm of
        #{dir := Dir, keeper := Keeper} ->
            %% The slots' part processes go with their keeper, closing their files.
            unlink(Keeper),
            exit(Keeper, kill),
            ok = erlcuda_shm:remove(Dir),
            ok = erlcuda_shm_slots:forget(Dir);
        none ->
            ok
    end,
    D#data{shm = none}.

provisional_devices(#{backend := cpu, cpu_devices := N}) -> N;
provisional_devices(_) -> 1.

%% A worker that is alive but of no use (silent, broken, without its writer): closing its
%% port alone would leave it running.
kill_worker(Why, #data{os_pid = OsPid} = D) ->
    kill(OsPid),
    worker_died(Why, D).

worker_died(Why, #data{os_pid = OsPid} = D) ->
    ?LOG_ERROR("erlcuda: worker ~p down: ~p", [OsPid, Why]),
    back_off(Why, down(Why, D)).

%% The worker is gone: its port, its writer, its jobs and calls answered, its folder.
down(Why, #data{port = Port, writer = Writer} = D) ->
    ok = erlcuda_events:worker(down, #{duration => life(D)}, (worker_meta(D))#{reason => Why}),
    ok = erlcuda_status:set_down(Why),
    ok = erlcuda_status:set_worker_os_pid(undefined),
    _ = [catch port_close(Port) || Port =/= undefined],
    %% Before the jobs are failed: a caller that hands a frame over after this sees the
    %% writer gone and takes its job back itself.
    stop_writer(Writer),
    fail_calls({worker_down, Why}, backing_off, D),
    ok = erlcuda_jobs:fail_all(Why),
    remove_folder(D#data{port = undefined, os_pid = undefined, calls = #{},
                         busy_since = undefined, writer = undefined, down_reason = Why}).

stop_writer(undefined) ->
    ok;
stop_writer({Pid, _}) ->
    unlink(Pid),
    exit(Pid, kill),
    ok.

back_off(Why, #data{restarts = N, backoff = Backoff, started = Started, waiting = W,
                    answered = Answered} = D) ->
    ok = case Why of
             {bad_python, Detail} -> erlcuda_status:set_bad_python(Detail);
             _ -> erlcuda_status:set_down(Why)
         end,
    Ceiling = case Answered of
                  true -> ?MAX_BACKOFF;
                  false -> ?MAX_START_BACKOFF
              end,
    Delay = case Answered andalso now_ms() - Started > ?STABLE_MS of
                true -> 0;
                false -> min(max(Backoff * 2, ?MIN_BACKOFF), Ceiling)
            end,
    ok = erlcuda_events:worker(restart,
                               #{backoff => erlang:convert_time_unit(Delay, millisecond, native)},
                               #{restarts => N + 1, reason => Why}),
    {next_state, backing_off,
     D#data{restarts = N + 1, backoff = Delay, down_reason = Why, waiting = []},
     [{state_timeout, Delay, restart}
      | [{reply, From, start_result(D#data{down_reason = Why})} || From <- W]]}.

%% What a first start that ended tells the application: worker arguments it refused stop
%% the start, rather than a worker that would restart for ever.
start_result(#data{down_reason = {bad_config, _, _, _} = Bad}) -> {error, Bad};
start_result(#data{down_reason = {bad_python, _} = Bad, config = #{on_bad_python := fail}}) ->
    {error, Bad};
start_result(_) -> ok.

%% The worker refuses a command line with the usage status before it says hello. Ours is
%% always well formed: one it refused holds `worker_args' it does not take.
exit_reason(?EXIT_USAGE, starting, #data{config = #{worker_args := [_ | _] = Args}}) ->
    {bad_config, worker_args, Args,
     <<"arguments that python -m erlcuda serve takes (the worker's usage message is logged)">>};
exit_reason(Status, _, _) ->
    {exit_status, Status}.

%% A worker that is alive but answers nothing while jobs wait is stuck (a hung driver call,
%% a kernel that never ends): kill it, so its jobs get an error and a new worker starts.
watchdog(State, D) when State =/= ready ->
    %% A start is bounded by its own hello timeout.
    {keep_state, D};
watchdog(_, #data{config = #{watchdog_ms := infinity}} = D) ->
    {keep_state, D};
watchdog(_, #data{config = #{watchdog_ms := Limit}, os_pid = OsPid, last_frame = Last,
                  busy_since = Busy} = D) ->
    Now = now_ms(),
    case erlcuda_jobs:size() of
        0 ->
            {keep_state, D#data{busy_since = undefined}};
        _ when Busy =:= undefined ->
            {keep_state, D#data{busy_since = Now}};
        _ ->
            case Now - max(Last, Busy) of
                Silent when Silent > Limit ->
                    ?LOG_ERROR("erlcuda: worker ~p made no progress for ~b ms with jobs "
                               "waiting; killing it", [OsPid, Silent]),
                    kill_worker({stuck, Silent}, D);
                _ ->
                    {keep_state, D}
            end
    end.

tick_ms(#data{config = #{watchdog_ms := infinity}}) -> ?SWEEP_MS;
tick_ms(#data{config = #{watchdog_ms := Limit}}) -> max(min(Limit div 4, ?SWEEP_MS), 10).

%% Never suspended: a port whose worker stopped reading, full of launches, must not stop
%% this process (and with it the watchdog that would free everyone).
send_call(Fun, Args, Caller, #data{port = Port, next_call = Id, calls = Calls} = D) ->
    case erlcuda_writer:direct(Port, erlcuda_protocol:encode_call(Id, Fun, Args)) of
        true -> {ok, D#data{calls = Calls#{Id => Caller}, next_call = Id + 1}};
        busy -> {error, port_busy};
        closed -> {error, {worker_down, port_closed}}
    end.

fail_calls(Why, State, #data{calls = Calls} = D) ->
    _ = [gen_statem:reply(From, case Caller of
                                    {info, _} -> unanswered_info(State, D);
                                    _ -> {error, Why}
                                end)
         || {Kind, From} = Caller <- maps:values(Calls), Kind =/= replay],
    ok.

unanswered_info(State, D) ->
    (merge_info(D#data.hello, State, D))#{worker_answered => false}.

merge_info(Worker, State, #data{os_pid = OsPid, restarts = Restarts, down_reason = Down,
                                hello = Hello, writer = Writer} = D) ->
    Status = erlcuda_status:status(),
    Queues = maps:get(queues, Status),
    Devices = device_info(Worker, device_info(Hello, [])),
    PerDevice = [Dev#{in_flight => erlcuda_status:in_flight(Queues, I),
                      waiting => erlcuda_status:waiting(Queues, I)}
                 || {I, Dev} <- lists:zip(lists:seq(0, length(Devices) - 1), Devices)],
    WorkerStatus = case {State, maps:get(status, Status)} of
                       {starting, _} -> starting;
                       {replaying, _} -> starting;
                       {measuring, _} -> starting;
                       {_, S} -> S
                   end,
    %% No worker runs: the status an earlier one reported is not this one's.
    Python = case Down of
                 {bad_python, _} when State =/= ready -> #{status => Down};
                 _ -> #{}
             end,
    (maps:merge(maps:merge(maps:without([device_info, os_pid], Hello),
                           maps:without([device_info, os_pid], Worker)), Python))#{
        backend => maps:get(backend, Worker, maps:get(backend, Hello, undefined)),
        devices => maps:get(devices, Worker, maps:get(devices, Hello, 0)),
        device_info => PerDevice,
        worker_os_pid => OsPid,
        worker_status => WorkerStatus,
        restarts => Restarts,
        last_down_reason => Down,
        jobs => erlcuda_jobs:counters(),
        epoch => D#data.epoch,
        owned_buffers => erlcuda_buffers:count(),
        backoff_ms => D#data.backoff,
        writer => erlcuda_writer:stats(writer_counters(Writer)),
        shm_threshold => case D#data.shm of #{threshold := T} -> T; none -> none end,
        shm_figures => case D#data.measured of
                           {T, Figures} when is_integer(T) -> Figures;
                           _ -> []
                       end,
        shm_slots => erlcuda_shm_slots:stats()}.

writer_counters({_, Counters}) -> Counters;
writer_counters(undefined) -> undefined.

%% The worker's per-device maps, where it sent a list of maps; else the fallback.
device_info(#{device_info := Devices}, Fallback) when is_list(Devices) ->
    case lists:all(fun is_map/1, Devices) of
        true -> Devices;
        false -> Fallback
    end;
device_info(_, Fallback) ->
    Fallback.

%% OS processes, without a shell.

kill(undefined) ->
    ok;
kill(OsPid) ->
    case os:find_executable("kill") of
        false ->
            _ = os:cmd("kill -9 " ++ integer_to_list(OsPid)),
            ok;
        Kill ->
            %% Its exit status comes back as a message, ignored by handle_event/4.
            _ = open_port({spawn_executable, Kill},
                          [{args, ["-9", integer_to_list(OsPid)]}, exit_status, hide]),
            ok
    end.

reap(undefined, _) ->
    ok;
reap(OsPid, 0) ->
    kill(OsPid);
reap(OsPid, N) ->
    case alive(OsPid) of
        false -> ok;
        _ -> timer:sleep(50), reap(OsPid, N - 1)
    end.

%% Where there is no /proc, the worker is given its time and then killed.
alive(OsPid) ->
    case filelib:is_dir("/proc/self") of
        true -> filelib:is_dir("/proc/" ++ integer_to_list(OsPid));
        false -> unknown
    end.

now_ms() ->
    erlang:monotonic_time(millisecond).

%% For the worker events (erlcuda_events): how long the worker has been running, and what
%% names it.
life(#data{started = Started}) ->
    erlang:convert_time_unit(now_ms() - Started, millisecond, native).

worker_meta(#data{os_pid = OsPid, hello = Hello, config = Config}) ->
    #{os_pid => OsPid, backend => maps:get(backend, Hello, maps:get(backend, Config))}.
