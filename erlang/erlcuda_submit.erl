%% @private
%% The launch path, run in the caller's process: pick the device, count the job into its
%% queue, register it, and write its frame to the port. No shared server is on this path.
-module(erlcuda_submit).

-export([submit/2]).

%% @doc Write a checked job to the worker; the reply goes to `ReplyTo'.
-spec submit(erlcuda_job:job(), pid() | reference()) ->
    {ok, erlcuda:job_id()} | {error, erlcuda:reason()}.
submit(Job, ReplyTo) ->
    case erlcuda_status:status() of
        #{status := up} = Status -> route(Job, ReplyTo, Status);
        #{status := {unavailable, Why}} -> {error, {backend_unavailable, Why}};
        #{status := {down, Why}} -> {error, {worker_down, Why}}
    end.

route(#{device := Want, kernel := Kernel, args := Args, format := Format, trace := Trace},
      ReplyTo, #{queues := Queues} = Status) ->
    JobId = erlcuda_jobs:next_id(),
    case erlcuda_status:pick(Want, Status) of
        {ok, Device} ->
            case erlcuda_protocol:encode_launch(JobId, Device, Kernel, Args, Trace) of
                {ok, Frame} ->
                    case erlcuda_status:enqueue(Status, Device) of
                        ok ->
                            ok = erlcuda_jobs:register(#{id => JobId, reply_to => ReplyTo,
                                                         caller => self(), device => Device,
                                                         queues => Queues, kernel => Kernel,
                                                         format => Format,
                                                         sync => is_reference(ReplyTo)}),
                            write(Status, Frame, JobId);
                        overloaded ->
                            {error, overloaded}
                    end;
                {error, _} = Error ->
                    Error
            end;
        {error, _} = Error ->
            Error
    end.

%% The caller writes its frame itself while nothing waits for the writer and the port is
%% not busy (a lone job pays no hop), else hands it to the port's writer. Never suspended.
write(#{port := Port, writer := Writer, writer_counters := Counters}, Frame, JobId) ->
    Direct = case erlcuda_writer:pending(Counters) of
                 0 -> port_write(Port, Frame);
                 _ -> busy
             end,
    case Direct of
        true -> {ok, JobId};
        closed -> port_closed(JobId);
        _ ->
            case erlcuda_writer:hand_over(Writer, Counters, Frame, iolist_size(Frame)) of
                true -> {ok, JobId};
                false -> port_closed(JobId)
            end
    end.

port_write(Port, Frame) ->
    try erlang:port_command(Port, Frame, [nosuspend]) of
        true -> true;
        false -> busy
    catch
        error:badarg -> closed
    end.

%% The port died under us. If the owner's sweep took the job first, the caller already has
%% its worker_down.
port_closed(JobId) ->
    case erlcuda_jobs:withdraw(JobId) of
        true -> {error, {worker_down, port_closed}};
        false -> {ok, JobId}
    end.
