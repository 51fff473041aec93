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
      ReplyTo, #{port := Port, queues := Queues} = Status) ->
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
                            write(Port, Frame, JobId);
                        overloaded ->
                            {error, overloaded}
                    end;
                {error, _} = Error ->
                    Error
            end;
        {error, _} = Error ->
            Error
    end.

write(Port, Frame, JobId) ->
    try erlang:port_command(Port, Frame) of
        true -> {ok, JobId}
    catch
        error:badarg ->
            %% The port died under us. If the owner's sweep took the job first, the caller
            %% already has its worker_down.
            case erlcuda_jobs:withdraw(JobId) of
                true -> {error, {worker_down, port_closed}};
                false -> {ok, JobId}
            end
    end.
