%% @private
%% The worker's owner: a gen_server holding the port to the Python worker process.
%%
%% Launches do not pass through this process. A caller checks its job, registers it in the
%% public `erlcuda_jobs' table and writes its frame to the port itself (`submit/2'). This
%% process only forwards each result to its caller (a port's output goes to its owner) and,
%% when the worker dies, answers every job still registered with `{worker_down, Why}' and
%% starts a new worker, backing off while starts keep failing. Control calls (info) are
%% erlport calls `{'C', Id, erlcuda, Fun, Args}' answered by `{'r', Id, R}' / `{'e', Id, E}'.
-module(erlcuda_port).
-behaviour(gen_server).

%% API.
-export([start_link/0, submit/2, info/0, call/3, create_tables/0, worker_atoms/0]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2, handle_info/2, terminate/2]).

-include_lib("kernel/include/logger.hrl").

-define(JOBS, erlcuda_jobs).
-define(STATE, erlcuda_state).
-define(MIN_BACKOFF, 100).
-define(MAX_BACKOFF, 5000).
%% A worker that lives this long is healthy: its next crash restarts it at once.
-define(STABLE_MS, 10000).
-define(INFO_WAIT, 2000).

-record(st, {port :: port() | undefined,
             os_pid :: integer() | undefined,
             started :: integer(),
             calls = #{} :: #{pos_integer() => gen_server:from()},
             next_call = 1 :: pos_integer(),
             info = #{} :: map(),
             restarts = 0 :: non_neg_integer(),
             backoff = 0 :: non_neg_integer(),
             down_reason :: term(),
             last_frame = 0 :: integer(),
             busy_since :: integer() | undefined}).

%% API.

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc The tables that outlive this server: they are created by the application's own
%% process, so a crash here never loses the list of jobs that are owed a reply.
-spec create_tables() -> ok.
create_tables() ->
    ?JOBS = ets:new(?JOBS, [set, public, named_table, {write_concurrency, true},
                            {read_concurrency, true}]),
    ?STATE = ets:new(?STATE, [set, public, named_table, {read_concurrency, true}]),
    true = ets:insert(?STATE, {worker, {down, starting}, undefined, 0, undefined, 0}),
    ok.

%% @doc Write a checked job to the worker; the reply goes to `ReplyTo'. Runs in the caller.
-spec submit(erlcuda_job:job(), pid() | reference()) ->
    {ok, erlcuda:job_id()} | {error, erlcuda:reason()}.
submit(Job, ReplyTo) ->
    try ets:lookup(?STATE, worker) of
        [{worker, up, Port, Devices, Queues, MaxQueue}] ->
            submit(Job, ReplyTo, Port, Devices, Queues, MaxQueue);
        [{worker, {unavailable, Why}, _, _, _, _}] ->
            {error, {backend_unavailable, Why}};
        [{worker, {down, Why}, _, _, _, _}] ->
            {error, {worker_down, Why}}
    catch
        error:badarg -> {error, {worker_down, not_running}}
    end.

submit(#{device := Want, kernel := Kernel, args := Args, format := Format, trace := Trace},
       ReplyTo, Port, Devices, Queues, MaxQueue) ->
    case pick_device(Want, Devices, Queues) of
        {ok, Device} ->
            case atomics:add_get(Queues, Device + 1, 1) of
                Depth when Depth > MaxQueue ->
                    atomics:sub(Queues, Device + 1, 1),
                    {error, overloaded};
                _ ->
                    JobId = erlang:unique_integer([positive]),
                    true = ets:insert(?JOBS, {JobId, ReplyTo, Device, Queues}),
                    Opts = #{format => Format, trace => Trace},
                    Frame = erlcuda_job:encode_launch(JobId, ReplyTo, Device, Kernel, Args,
                                                      Opts),
                    write(Port, Frame, JobId)
            end;
        {error, _} = Error ->
            Error
    end.

pick_device(any, Devices, Queues) when Devices > 0 ->
    {ok, shortest(Queues, Devices - 1, 0, atomics:get(Queues, 1))};
pick_device(N, Devices, _) when is_integer(N), N < Devices ->
    {ok, N};
pick_device(N, _, _) ->
    {error, {bad_device, N}}.

shortest(_, 0, Best, _) -> Best;
shortest(Queues, I, Best, BestDepth) ->
    case atomics:get(Queues, I + 1) of
        D when D < BestDepth -> shortest(Queues, I - 1, I, D);
        _ -> shortest(Queues, I - 1, Best, BestDepth)
    end.

write(Port, Frame, JobId) ->
    try erlang:port_command(Port, Frame) of
        true -> {ok, JobId}
    catch
        error:badarg ->
            %% The port died under us. Whoever takes the entry owes the one reply: if the
            %% server's sweep got there first, the caller already has its worker_down.
            case ets:take(?JOBS, JobId) of
                [{_, _, Device, Queues}] ->
                    atomics:sub(Queues, Device + 1, 1),
                    {error, {worker_down, port_closed}};
                [] ->
                    {ok, JobId}
            end
    end.

%% @doc The worker's report merged with this side's view of it.
-spec info() -> map().
info() ->
    gen_server:call(?MODULE, info, 10000).

%% @doc An erlport call into the worker (`Fun' is one of the worker's control functions).
-spec call(atom(), list(), timeout()) -> {ok, term()} | {error, term()}.
call(Fun, Args, Timeout) ->
    gen_server:call(?MODULE, {call, Fun, Args}, Timeout).

%% @doc Every atom the worker may send. Results are decoded with `binary_to_term(B, [safe])',
%% which refuses atoms the node does not know yet: listing them here makes them exist once
%% this module is loaded. A test checks the worker's sources against this list.
-spec worker_atoms() -> [atom()].
worker_atoms() ->
    ['M', 'C', 'L', r, e, erlcuda, ok, error, launch, list, binary, format, trace,
     %% reasons
     bad_args, bad_device, unknown_kernel, backend_unavailable, cuda, too_large, internal,
     non_finite,
     %% cuda error codes
     out_of_memory, launch_failed, illegal_address, invalid_value, not_supported, unknown,
     %% log levels
     debug, info, notice, warning,
     %% info
     backend, status, reason, devices, os_pid, python, batching, device_info, cpu,
     jobs, launches, max_batch, errors, queue, unavailable,
     name, total_memory, free_memory, compute_capability].

%% gen_server.

-spec init([]) -> {ok, #st{}}.
init([]) ->
    process_flag(trap_exit, true),
    %% Jobs left by a crashed predecessor have no worker any more.
    fail_all(server_restarted),
    {ok, Watchdog} = application:get_env(erlcuda, watchdog_ms),
    _ = [timer:send_interval(max(Watchdog div 4, 10), watchdog) || is_integer(Watchdog)],
    {ok, start_worker(#st{started = now_ms()})}.

-spec handle_call(term(), gen_server:from(), #st{}) ->
    {reply, term(), #st{}} | {noreply, #st{}}.
handle_call(info, From, #st{port = undefined} = St) ->
    gen_server:reply(From, merge_info(#{}, St)),
    {noreply, St};
handle_call(info, From, #st{next_call = Id} = St) ->
    %% A worker busy with a long control call must not leave info/0 waiting: past
    %% ?INFO_WAIT the answer is this side's view and the counters from the worker's start.
    _ = erlang:send_after(?INFO_WAIT, self(), {info_timeout, Id}),
    {noreply, send_call(info, [], {info, From}, St)};
handle_call({call, _, _}, _From, #st{port = undefined, down_reason = Why} = St) ->
    {reply, {error, {worker_down, Why}}, St};
handle_call({call, Fun, Args}, From, St) ->
    {noreply, send_call(Fun, Args, {plain, From}, St)};
handle_call(_Request, _From, St) ->
    {reply, {error, unknown_call}, St}.

-spec handle_cast(term(), #st{}) -> {noreply, #st{}}.
handle_cast(_Msg, St) ->
    {noreply, St}.

-spec handle_info(term(), #st{}) -> {noreply, #st{}}.
handle_info({Port, {data, Data}}, #st{port = Port} = St) ->
    {noreply, frame(Data, St#st{last_frame = now_ms()})};
handle_info({Port, {exit_status, Status}}, #st{port = Port} = St) ->
    {noreply, worker_died({exit_status, Status}, St)};
handle_info({'EXIT', Port, Why}, #st{port = Port} = St) ->
    {noreply, worker_died({port_exit, Why}, St)};
handle_info(restart_worker, #st{port = undefined} = St) ->
    {noreply, start_worker(St)};
handle_info(watchdog, St) ->
    {noreply, watchdog(St)};
handle_info({info_timeout, Id}, #st{calls = Calls} = St) ->
    case maps:take(Id, Calls) of
        {{info, From}, Rest} ->
            gen_server:reply(From, (merge_info(St#st.info, St))#{worker_answered => false}),
            {noreply, St#st{calls = Rest}};
        _ ->
            {noreply, St}
    end;
handle_info(_Other, St) ->
    {noreply, St}.

-spec terminate(term(), #st{}) -> ok.
terminate(Reason, #st{port = Port, os_pid = OsPid} = St) ->
    set_state({down, stopping}),
    _ = (catch port_close(Port)),
    fail_calls({worker_down, stopping}, St),
    fail_all({server_stopped, Reason}),
    %% The worker ends on its own once its input closes (popping its CUDA contexts); one
    %% that does not within a few seconds is killed rather than left behind.
    reap(OsPid, 40).

reap(undefined, _) ->
    ok;
reap(OsPid, 0) ->
    kill(OsPid);
reap(OsPid, N) ->
    case os:cmd("kill -0 " ++ integer_to_list(OsPid) ++ " 2>/dev/null || printf gone") of
        "gone" -> ok;
        _ -> timer:sleep(50), reap(OsPid, N - 1)
    end.

%% Internal.

frame(Data, St) ->
    try binary_to_term(Data, [safe]) of
        {'M', _, {erlcuda, JobId, Result}} ->
            forward(JobId, {erlcuda, JobId, Result}),
            St;
        {'M', _, {erlcuda, JobId, Result, Trace}} ->
            forward(JobId, {erlcuda, JobId, Result,
                            Trace#{<<"forward">> => erlang:monotonic_time(nanosecond)}}),
            St;
        {'r', Id, Reply} -> answer(Id, {ok, Reply}, St);
        {'e', Id, Error} -> answer(Id, {error, Error}, St);
        {'L', Level, Text} -> worker_log(Level, Text), St;
        Other -> ?LOG_ERROR("erlcuda: unexpected frame from the worker: ~0P", [Other, 20]), St
    catch
        error:badarg ->
            ?LOG_ERROR("erlcuda: undecodable frame of ~b bytes from the worker",
                       [byte_size(Data)]),
            St
    end.

forward(JobId, Message) ->
    case ets:take(?JOBS, JobId) of
        [{_, ReplyTo, Device, Queues}] ->
            atomics:sub(Queues, Device + 1, 1),
            ReplyTo ! Message,
            ok;
        [] ->
            ok
    end.

answer(Id, Reply, #st{calls = Calls} = St) ->
    case maps:take(Id, Calls) of
        {{info, From}, Rest} ->
            Info = case Reply of {ok, M} when is_map(M) -> M; _ -> #{} end,
            gen_server:reply(From, merge_info(Info, St)),
            St#st{calls = Rest};
        {{plain, From}, Rest} ->
            gen_server:reply(From, Reply),
            St#st{calls = Rest};
        {hello, Rest} ->
            hello(Reply, St#st{calls = Rest});
        error ->
            St
    end.

worker_log(Level, Text) when Level =:= debug; Level =:= info; Level =:= notice;
                             Level =:= warning; Level =:= error ->
    logger:log(Level, "erlcuda worker: ~ts", [Text], #{domain => [erlcuda]});
worker_log(_, Text) ->
    worker_log(info, Text).

send_call(Fun, Args, Tag, #st{port = Port, next_call = Id, calls = Calls} = St) ->
    Frame = term_to_binary({'C', Id, erlcuda, Fun, Args}),
    true = port_command(Port, Frame),
    St#st{calls = Calls#{Id => Tag}, next_call = Id + 1}.

start_worker(St0) ->
    St = St0#st{started = now_ms()},
    {ok, Config} = config(),
    #{python := Python, args := Args, env := Env} = Config,
    try open_port({spawn_executable, Python},
                  [{args, Args}, {env, Env}, {packet, 4}, binary, exit_status, nouse_stdio,
                   hide]) of
        Port ->
            {os_pid, OsPid} = erlang:port_info(Port, os_pid),
            %% The last worker's hello no longer counts; its device count serves until the
            %% new one answers (jobs may be written as soon as the port exists: the worker
            %% reads them after the hello).
            Info = maps:remove(hello_done, St#st.info),
            St1 = St#st{port = Port, os_pid = OsPid, last_frame = now_ms(), info = Info},
            set_up(Port, maps:get(devices, Info, maps:get(cpu_devices, Config))),
            Deadline = now_ms() + maps:get(start_timeout, Config),
            wait_hello(send_call(hello, [], hello, St1), Deadline)
    catch
        error:Why ->
            ?LOG_ERROR("erlcuda: cannot start the worker ~ts: ~p", [Python, Why]),
            schedule_restart({spawn_failed, Why}, St)
    end.

%% The first answer, awaited here so that the application is ready when it has started.
wait_hello(#st{port = Port} = St, Deadline) ->
    receive
        {Port, {data, Data}} ->
            St1 = frame(Data, St),
            case maps:is_key(hello_done, St1#st.info) of
                true -> St1;
                false -> wait_hello(St1, Deadline)
            end;
        {Port, {exit_status, Status}} ->
            worker_died({exit_status, Status}, St)
    after max(Deadline - now_ms(), 0) ->
        ?LOG_ERROR("erlcuda: the worker did not answer its hello in time"),
        kill(St#st.os_pid),
        worker_died(start_timeout, St)
    end.

hello({ok, Info}, #st{port = Port} = St) when is_map(Info) ->
    #{backend := Backend, devices := Devices, reason := Reason} = Info,
    ?LOG_NOTICE("erlcuda: worker ~p started: ~ts", [St#st.os_pid, Reason]),
    case maps:get(status, Info, ok) of
        ok -> set_up(Port, Devices);
        {backend_unavailable, Why} -> set_state({unavailable, Why})
    end,
    St#st{info = Info#{hello_done => true, backend => Backend}};
hello(Other, St) ->
    ?LOG_ERROR("erlcuda: the worker's hello failed: ~0P", [Other, 20]),
    St#st{info = #{hello_done => true}}.

set_up(Port, Devices) ->
    case ets:lookup(?STATE, worker) of
        [{worker, up, Port, Devices, _, _}] ->
            ok;  % the hello confirmed the count: keep the counters of jobs already sent
        _ ->
            {ok, MaxQueue} = application:get_env(erlcuda, max_queue),
            Queues = atomics:new(max(Devices, 1), [{signed, true}]),
            true = ets:insert(?STATE, {worker, up, Port, Devices, Queues, MaxQueue}),
            ok
    end.

set_state(Status) ->
    true = ets:insert(?STATE, {worker, Status, undefined, 0, undefined, 0}),
    ok.

%% A worker that is alive but answers nothing while jobs wait is stuck (a hung driver call,
%% a kernel that never ends): kill it, so its jobs get an error and a new worker starts.
watchdog(#st{port = undefined} = St) ->
    St;
watchdog(#st{os_pid = OsPid, last_frame = Last, busy_since = Busy} = St) ->
    {ok, Limit} = application:get_env(erlcuda, watchdog_ms),
    Now = now_ms(),
    case ets:info(?JOBS, size) of
        0 ->
            St#st{busy_since = undefined};
        _ when Busy =:= undefined ->
            St#st{busy_since = Now};
        _ ->
            case Now - max(Last, Busy) of
                Silent when Silent > Limit ->
                    ?LOG_ERROR("erlcuda: worker ~p made no progress for ~b ms with jobs "
                               "waiting; killing it", [OsPid, Silent]),
                    kill(OsPid),
                    worker_died({stuck, Silent}, St#st{busy_since = undefined});
                _ ->
                    St
            end
    end.

%% A live but unresponsive worker: closing the port alone would leave it running.
kill(OsPid) ->
    _ = os:cmd("kill -9 " ++ integer_to_list(OsPid)),
    ok.

worker_died(Why, #st{port = Port} = St) ->
    ?LOG_ERROR("erlcuda: worker ~p down: ~p", [St#st.os_pid, Why]),
    set_state({down, Why}),
    _ = (catch port_close(Port)),
    fail_calls({worker_down, Why}, St),
    fail_all(Why),
    schedule_restart(Why, St#st{port = undefined, os_pid = undefined, calls = #{}}).

schedule_restart(Why, #st{restarts = N, backoff = Backoff, started = Started} = St) ->
    set_state({down, Why}),
    Delay = case now_ms() - Started > ?STABLE_MS of
                true -> 0;
                false -> min(max(Backoff * 2, ?MIN_BACKOFF), ?MAX_BACKOFF)
            end,
    _ = erlang:send_after(Delay, self(), restart_worker),
    St#st{restarts = N + 1, backoff = Delay, down_reason = Why}.

fail_calls(Why, #st{calls = Calls}) ->
    [gen_server:reply(From, {error, Why}) || {_, From} <- maps:values(Calls)],
    ok.

%% Every job still registered is owed a reply: take each (so a racing caller cannot answer
%% it twice) and tell its caller the worker is gone.
fail_all(Why) ->
    Ids = ets:select(?JOBS, [{{'$1', '_', '_', '_'}, [], ['$1']}]),
    lists:foreach(
      fun(JobId) ->
              case ets:take(?JOBS, JobId) of
                  [{_, ReplyTo, Device, Queues}] ->
                      atomics:sub(Queues, Device + 1, 1),
                      ReplyTo ! {erlcuda, JobId, {error, {worker_down, Why}}};
                  [] ->
                      ok
              end
      end, Ids).

merge_info(Worker, #st{os_pid = OsPid, restarts = Restarts, down_reason = Down} = St) ->
    [{worker, Status, _, _, Queues, _}] = ets:lookup(?STATE, worker),
    Devices = maps:get(device_info, Worker, []),
    PerDevice = [D#{in_flight => in_flight(Queues, I)}
                 || {I, D} <- lists:zip(lists:seq(0, length(Devices) - 1), Devices)],
    Base = maps:without([hello_done, device_info, os_pid], St#st.info),
    (maps:merge(Base, maps:without([device_info, os_pid], Worker)))#{
        backend => maps:get(backend, Worker, maps:get(backend, St#st.info, undefined)),
        devices => maps:get(devices, Worker, 0),
        device_info => PerDevice,
        worker_os_pid => OsPid,
        worker_status => Status,
        restarts => Restarts,
        last_down_reason => Down}.

in_flight(undefined, _) -> 0;
in_flight(Queues, I) -> atomics:get(Queues, I + 1).

config() ->
    Env = fun(K) -> {ok, V} = application:get_env(erlcuda, K), V end,
    Backend = Env(backend),
    CpuDevices = Env(cpu_devices),
    MaxBatch = case Env(batching) of true -> Env(max_batch); false -> 1 end,
    Root = erlcuda_paths:root(),
    Args = ["-m", "erlcuda", "serve", "--backend", atom_to_list(Backend),
            "--cpu-devices", integer_to_list(CpuDevices),
            "--max-batch", integer_to_list(MaxBatch),
            "--spin-us", case Env(spin_us) of auto -> "-1"; Us -> integer_to_list(Us) end
           | Env(worker_args)]
        ++ [ "--test-hooks" || application:get_env(erlcuda, test_hooks) =:= {ok, true}],
    {ok, #{python => erlcuda_paths:python(Root, Env(python)),
           args => Args,
           env => [{"PYTHONPATH", python_path(filename:join(Root, "python"))},
                   {"PYTHONUNBUFFERED", "1"}],
           cpu_devices => case Backend of cpu -> CpuDevices; _ -> 1 end,
           start_timeout => Env(start_timeout)}}.

python_path(Ours) ->
    case os:getenv("PYTHONPATH") of
        Path when is_list(Path), Path =/= "" -> Ours ++ ":" ++ Path;
        _ -> Ours
    end.

now_ms() ->
    erlang:monotonic_time(millisecond).
