%% @private
%% Large operands and results through shared memory: files in a folder of the worker's own
%% under `shm_dir' (default /dev/shm), instead of the port's pipe.
%%
%% The port owner makes a folder for each worker it starts (`erlcuda-<OsPid>-<N>', mode 0700)
%% and removes it when that worker ends; the worker's reaper process removes it too, even
%% when the node itself dies; and a worker removes, as it starts, the folders whose worker
%% and reaper both died (python/erlcuda/shm.py says how it tells them). A caller
%% writes its operands over the threshold to `i<JobId>-<Arg>' (after the job is registered,
%% so that every path that ends the job deletes them) and the worker unlinks them once
%% mapped. A result over the threshold comes back in `r<JobId>', which a deliverer
%% (erlcuda_delivery) reads, deletes and sends, so that the shared port owner never copies it.
-module(erlcuda_shm).

-export([folder/1, remove/1, plan/3, stage/1, delete/2, take_result/3]).

-export_type([folder/0, plan/0]).

-define(PREFIX, "erlcuda-").

%% A worker's folder and the size from which a vector travels through it.
-type folder() :: #{dir := file:filename(), threshold := pos_integer()}.
%% The operands to write: `{File, Binary}'.
-type plan() :: [{file:filename(), binary()}].

%% @doc A new, empty folder for one worker under `Base'.
-spec folder(file:filename()) -> {ok, file:filename()} | {error, term()}.
folder(Base) ->
    Dir = filename:join(Base, ?PREFIX ++ os:getpid() ++ "-"
                        ++ integer_to_list(erlang:unique_integer([positive]))),
    case file:make_dir(Dir) of
        ok ->
            %% Operands are the callers' data: other users must not read them.
            case file:change_mode(Dir, 8#700) of
                ok -> {ok, Dir};
                {error, Why} -> _ = file:del_dir(Dir), {error, {Dir, Why}}
            end;
        {error, Why} ->
            {error, {Dir, Why}}
    end.

%% @doc Remove a folder made by `folder/1' and what it holds.
-spec remove(file:filename() | undefined) -> ok.
remove(undefined) ->
    ok;
remove(Dir) ->
    case lists:prefix(?PREFIX, filename:basename(Dir)) of
        true -> _ = file:del_dir_r(Dir), ok;
        false -> ok
    end.

%% @doc Which of a job's arguments go through the folder: the arguments as the launch
%% names them (`{file, Name, Bytes}' for those) and what to write, in order.
-spec plan(folder() | none, erlcuda:job_id(), [binary() | non_neg_integer()]) ->
    {[binary() | non_neg_integer() | {file, binary(), non_neg_integer()}], plan()}.
plan(none, _, Args) ->
    {Args, []};
plan(#{dir := Dir, threshold := Threshold}, JobId, Args) ->
    plan(Args, 1, Dir, Threshold, JobId, [], []).

plan([], _, _, _, _, Acc, Files) ->
    {lists:reverse(Acc), lists:reverse(Files)};
plan([Bin | Rest], I, Dir, Threshold, JobId, Acc, Files)
  when is_binary(Bin), byte_size(Bin) >= Threshold ->
    Name = iolist_to_binary(["i", integer_to_list(JobId), "-", integer_to_list(I)]),
    plan(Rest, I + 1, Dir, Threshold, JobId, [{file, Name, byte_size(Bin)} | Acc],
         [{filename:join(Dir, Name), Bin} | Files]);
plan([A | Rest], I, Dir, Threshold, JobId, Acc, Files) ->
    plan(Rest, I + 1, Dir, Threshold, JobId, [A | Acc], Files).

%% @doc Write the planned operands, several at once (each write runs on a dirty I/O
%% scheduler: two 64 MiB operands take the time of one); on failure, delete them all.
-spec stage(plan()) -> ok | {error, binary()}.
stage([]) ->
    ok;
stage([{File, Bin}]) ->
    checked([{File, file:write_file(File, Bin, [raw])}], [File]);
stage(Plan) ->
    %% Linked: writers die with a caller that dies, and the sweep of dead callers deletes
    %% the job's files. Unlinked once done, and any 'EXIT' of a caller trapping exits taken.
    Self = self(),
    Writers = [{spawn_link(fun() -> Self ! {staged, self(), file:write_file(F, B, [raw])} end),
                F} || {F, B} <- Plan],
    Results = [receive {staged, Pid, R} -> {F, R} end || {Pid, F} <- Writers],
    _ = [begin
             unlink(Pid),
             receive {'EXIT', Pid, _} -> ok after 0 -> ok end
         end || {Pid, _} <- Writers],
    checked(Results, [F || {F, _} <- Plan]).

checked(Results, Files) ->
    case [{F, Why} || {F, {error, Why}} <- Results] of
        [] ->
            ok;
        [{File, Why} | _] ->
            delete(Files, undefined),
            {error, iolist_to_binary(io_lib:format("shared memory: writing ~ts: ~p",
                                                   [File, Why]))}
    end.

%% @doc Delete files (operands of a job that has ended); missing ones are fine. With a
%% folder and a job id, also that job's result file.
-spec delete([file:filename()], {file:filename(), erlcuda:job_id()} | undefined) -> ok.
delete(Files, Result) ->
    lists:foreach(fun(F) -> _ = file:delete(F, [raw]) end, Files),
    case Result of
        {Dir, JobId} -> _ = file:delete(result_file(Dir, JobId), [raw]), ok;
        undefined -> ok
    end.

%% @doc Job `JobId''s result of `Bytes' bytes, read from its file in `Dir' and deleted: the
%% vector record it stands for, or an error.
-spec take_result(file:filename(), erlcuda:job_id(), non_neg_integer()) ->
    erlcuda_protocol:reply() | {error, erlcuda:reason()}.
take_result(Dir, JobId, Bytes) ->
    File = result_file(Dir, JobId),
    Reply = case read(File, Bytes) of
                {ok, Bin} when byte_size(Bin) =:= Bytes ->
                    erlcuda_protocol:vector_reply(Bin);
                {ok, Bin} ->
                    {error, {internal, iolist_to_binary(
                                         io_lib:format("shared memory: the result file holds "
                                                       "~b bytes, not ~b",
                                                       [byte_size(Bin), Bytes]))}};
                {error, Why} ->
                    {error, {internal, iolist_to_binary(
                                         io_lib:format("shared memory: reading the result: ~p",
                                                       [Why]))}}
            end,
    _ = file:delete(File, [raw]),
    Reply.

%% Raw: in this process, not through the file server that every file:read_file/1 shares.
read(File, Bytes) ->
    case file:open(File, [read, raw, binary]) of
        {ok, Fd} ->
            try file:read(Fd, Bytes + 1) of
                {ok, Bin} -> {ok, Bin};
                eof -> {ok, <<>>};
                {error, _} = Error -> Error
            after
                _ = file:close(Fd)
            end;
        {error, _} = Error ->
            Error
    end.

result_file(Dir, JobId) ->
    filename:join(Dir, "r" ++ integer_to_list(JobId)).
