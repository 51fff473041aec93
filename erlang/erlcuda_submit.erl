%% @private
%% The launch path, run in the caller's process: pick the device, count the job into its
%% queue, register it, and write its frame to the port. No shared server is on this path.
-module(erlcuda_submit).

-export([submit/2, may_wait/1]).

%% @doc Whether submitting `Job' now may wait: for room in a full queue (`{wait, Ms}'), or
%% for the port's writer, past its byte bound.
-spec may_wait(erlcuda_job:job()) -> boolean().
may_wait(#{wait := _}) ->
    true;
may_wait(_) ->
    case erlcuda_status:status() of
        #{status := up, writer_counters := Counters} -> erlcuda_writer:backlogged(Counters);
        _ -> false
    end.

%% @doc Write a checked job to the worker; the reply goes to `ReplyTo'. With the job's id,
%% what a process that waits for the reply needs to run its stop event.
-spec submit(erlcuda_job:job(), erlcuda_jobs:reply_to()) ->
    {ok, erlcuda:job_id(), erlcuda_telemetry:span()} | {error, erlcuda:reason()}.
submit(Job, ReplyTo) ->
    case erlcuda_status:status() of
        #{status := up} = Status -> route(Job, ReplyTo, Status);
        #{status := {unavailable, Why}} -> {error, {backend_unavailable, Why}};
        #{status := {bad_python, _} = Bad} -> {error, Bad};
        #{status := {down, Why}} -> {error, {worker_down, Why}}
    end.

%% A launch of the general path first checks its buffers against the worker now running.
route(#{general := #{buffers := Buffers}} = Job, ReplyTo, #{epoch := Epoch} = Status) ->
    case erlcuda_buffers:check(Buffers, Epoch) of
        ok -> route1(Job, ReplyTo, Status);
        {error, _} = Error -> Error
    end;
route(Job, ReplyTo, Status) ->
    route1(Job, ReplyTo, Status).

route1(#{device := Want, kernel := Kernel, args := Args, trace := Trace,
         result_bytes := ResultBytes} = Job, ReplyTo, Status) ->
    JobId = erlcuda_jobs:next_id(),
    Shm = transport(Job, maps:get(shm, Status, none)),
    %% Operands and results over the threshold go through shared memory (traced jobs'
    %% results through the pipe: their records carry the worker's stamps).
    {LaunchArgs, Operands} = erlcuda_shm:plan(Shm, JobId, Args),
    {ResultFile, Plan} = result_slot(Shm, Trace, ResultBytes, Operands),
    case erlcuda_status:pick(Want, Status) of
        {ok, Device} ->
            {Flags, Ctx} = general(Job, Device, Status),
            case erlcuda_protocol:encode_launch(JobId, Device, Kernel, LaunchArgs,
                                                Flags#{result_file => ResultFile}) of
                {ok, Frame} ->
                    enqueue(Job, ReplyTo, Status, #{id => JobId, device => Device,
                                                    flags => Flags, ctx => Ctx, plan => Plan},
                            Frame);
                {error, _} = Error ->
                    unplanned(Plan, Error)
            end;
        {error, _} = Error ->
            unplanned(Plan, Error)
    end.

%% A result over the threshold goes into a result slot of the job's, where there is room:
%% the launch names it, and the job holds it with its operands' files.
result_slot(#{threshold := T} = Shm, false, ResultBytes, Plan) when ResultBytes >= T ->
    case erlcuda_shm:result_slot(Shm, ResultBytes) of
        {ok, #{name := Name, part_bytes := PartBytes} = Slot} ->
            {{Name, PartBytes}, Plan ++ [{result, Slot}]};
        none ->
            {false, Plan}
    end;
result_slot(_, _, _, Plan) ->
    {false, Plan}.

%% The folder a job's vectors may take: the worker's, with the threshold it has, unless the
%% job says which transport (erlcuda_transports' jobs).
transport(#{transport := pipe}, _) -> none;
transport(#{transport := shm}, #{} = Shm) -> Shm#{threshold := 1};
transport(_, Shm) -> Shm.

%% A job refused before it was registered gives back the slots planned for it.
unplanned(Plan, Error) ->
    ok = erlcuda_shm:release(Plan),
    Error.

%% Counted into its device's queue (at once, or once there is room for a launch that waits
%% for it), registered, its start event, its files written, then its frame.
enqueue(Job, ReplyTo, Status, #{id := JobId, device := Device, plan := Plan} = Launch,
        Frame) ->
    Counted = case Job of
                  #{wait := Ms} -> erlcuda_room:enqueue(Status, Device, wait_until(Ms, Job));
                  #{} -> erlcuda_status:enqueue(Status, Device)
              end,
    case Counted of
        ok ->
            ok = register_job(Job, ReplyTo, Status, Launch),
            Span = started(Job, ReplyTo, Launch),
            case stage(Job, Status, Launch, Frame) of
                {ok, JobId} -> {ok, JobId, Span};
                {error, _} = Error -> Error
            end;
        overloaded ->
            unplanned(Plan, {error, overloaded})
    end.

%% A wait for room ends with the launch_sync that waits for its result.
wait_until(Ms, Job) ->
    min(erlcuda_await:deadline(Ms), maps:get(deadline, Job, infinity)).

%% Registered as soon as it is counted, with nothing between that may wait, so that the
%% sweep of dead callers gives its place back whenever this caller dies from then on; before
%% the files are written, so that every way the job ends deletes them. Buffers it keeps
%% belong to this caller from now on.
register_job(#{kernel := Kernel, format := Format, trace := Trace} = Job, ReplyTo,
             #{queues := Queues},
             #{id := JobId, device := Device, ctx := Ctx, plan := Plan}) ->
    ok = keep(Ctx, Device, ReplyTo),
    ok = erlcuda_jobs:register(#{id => JobId, reply_to => ReplyTo, caller => self(),
                                 device => Device, queues => Queues, kernel => Kernel,
                                 format => Format, trace => Trace,
                                 quiet => maps:get(quiet, Job, false),
                                 files => erlcuda_shm:kept(Plan), ctx => Ctx,
                                 expect => expect(Job, Ctx)}).

%% The job's start event, run once it is registered: its handlers are the users' code and
%% may take any time, and a caller killed in one has its place given back with its job by
%% the sweep of dead callers. Its span then goes into the job's entry, for the event
%% process to end where nobody waits for the reply. Only a worker going down takes an
%% entry before its frame is written: a job answered meanwhile went without its span, and
%% its exception event is run here, unless a waiting process (launch_sync, a proxy) runs it
%% with the reply. A quiet job (erlcuda_transports') has none.
started(Job, ReplyTo, #{id := JobId, device := Device}) ->
    case maps:get(quiet, Job, false) of
        true ->
            none;
        false ->
            Span = erlcuda_telemetry:job_start(JobId, Job, Device),
            case Span =:= none orelse erlcuda_jobs:started(JobId, Span)
                 orelse not is_pid(ReplyTo) of
                true -> ok;
                false -> erlcuda_telemetry:job_stop(Span, {error, {worker_down, down()}})
            end,
            Span
    end.

down() ->
    case erlcuda_status:status() of
        #{status := {down, Why}} -> Why;
        #{} -> port_closed
    end.

%% The operands' files written, then the frame; with no room in shared memory, the pipe
%% carries it all.
stage(#{kernel := Kernel, args := Args} = Job, Status,
      #{id := JobId, device := Device, flags := Flags, plan := Plan}, Frame) ->
    Deadline = maps:get(deadline, Job, infinity),
    case erlcuda_shm:stage(Plan) of
        ok ->
            write(Status, Frame, JobId, Deadline);
        {error, _} ->
            case erlcuda_protocol:encode_launch(JobId, Device, Kernel, Args,
                                                Flags#{result_file => false}) of
                {ok, Piped} -> write(Status, Piped, JobId, Deadline);
                {error, _} = E -> take_back(JobId, E)
            end
    end.

%% The flags and reply context of a launch: a plain one has only its trace and floats
%% flags and no context (its reply needs no buffers, epoch or shape).
general(#{trace := Trace, general := G}, Device, #{epoch := Epoch}) ->
    #{keep := NKeep, buffers := Buffers, shape := Shape} = G,
    Ids = erlcuda_buffers:next_ids(NKeep),
    Flags = #{trace => Trace},
    Flags1 = case NKeep of 0 -> Flags; _ -> Flags#{keep => Ids} end,
    Flags2 = maps:merge(Flags1, maps:with([geometry, program], G)),
    {Flags2, #{epoch => Epoch, device => Device, buffers => Buffers, shape => Shape,
               keep => Ids}};
general(#{trace := Trace, format := Format}, _, _) ->
    %% a caller that wants floats gets an f32 vector result as the ETF of their list, which
    %% it decodes in one call
    {#{trace => Trace, floats => Format =:= list}, none}.

keep(none, _, _) -> ok;
keep(#{keep := Ids, epoch := Epoch}, Device, ReplyTo) ->
    erlcuda_buffers:register(erlcuda_jobs:owner(ReplyTo), Device, Epoch, Ids).

%% What the job's reply must be: a job that keeps buffers answers with the ids it was given.
expect(_, #{keep := [_ | _] = Ids}) -> {keep, Ids};
expect(Job, _) -> maps:get(expect, Job, any).

%% The frame goes to the port through erlcuda_writer (at once, or handed to the port's
%% writer); the job is taken back where it may never be written.
write(Status, Frame, JobId, Deadline) ->
    case erlcuda_writer:launch(Status, Frame, Deadline) of
        written -> {ok, JobId};
        handed -> still_up(maps:get(writer, Status), JobId);
        closed -> port_closed(JobId);
        late -> take_back(JobId, {error, timeout})
    end.

%% The writer took the frame; if the worker went down meanwhile (its writer is no longer the
%% one published), the frame may never be written: take the job back unless the owner's
%% sweep already answered it.
still_up(Writer, JobId) ->
    case erlcuda_status:status() of
        #{writer := Writer} -> {ok, JobId};
        _ -> port_closed(JobId)
    end.

%% The port died under us. If the owner's sweep took the job first, the caller already has
%% its worker_down.
port_closed(JobId) ->
    take_back(JobId, {error, {worker_down, port_closed}}).

take_back(JobId, Error) ->
    case erlcuda_jobs:withdraw(JobId, Error) of
        true -> Error;
        false -> {ok, JobId}
    end.
