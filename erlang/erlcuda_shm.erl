%% @private
%% Large operands and results through shared memory: files in a folder of the worker's own
%% under `shm_dir' (default /dev/shm), instead of the port's pipe.
%%
%% The port owner makes a folder for each worker it starts (`erlcuda-<OsPid>-<N>', mode 0700)
%% and removes it when that worker ends; the worker's reaper process removes it too, even
%% when the node itself dies; and a worker removes, as it starts, the folders whose worker
%% and reaper both died (python/erlcuda/shm.py says how it tells them). A caller
%% writes its operands over the threshold into an operand slot (erlcuda_shm_slots: part
%% files kept from job to job, given back when the job's reply comes and deleted when the
%% job ends otherwise), or, where the slots have no room, to files of the job's own,
%% `i<JobId>-<Arg>.<K>' (after the job is registered, so that every path that ends the job
%% deletes them), which the worker unlinks once mapped. A result over the threshold comes back in `r<JobId>.0', which a deliverer
%% (erlcuda_delivery) reads, deletes and sends, so that the shared port owner never copies it.
%%
%% An operand is written as parts: the files `<Name>.0', `<Name>.1', ... of `part_bytes/1'
%% bytes each (the last one shorter; at most contract.json's `limits.shm_parts' parts, each
%% a whole number of ?PART_UNIT), each by a process of its own. Writes to one tmpfs file take
%% its inode's lock, so one file is written by one core at a time, where parts are written
%% by several at once. The worker sends a result back as one part (`r<JobId>.0'), read into
%% one binary in one call: parts would have to be joined into a new binary, a copy of the
%% whole result on a normal scheduler, which would hold up small jobs of other callers.
%% Several parts are still read, at once, if a record names them, up to as many as an
%% operand is cut into.
%%
%% Only regular files of this folder are written or read, never what a symlink names nor a
%% FIFO: a part is written to a new file (whatever already stands at its path is refused),
%% and a result's part must be a regular file of exactly its length before it is opened
%% (file:open/2 has no O_NOFOLLOW), and the same file once open. A result record is
%% trusted no further than the files that exist: one naming more parts than a vector is
%% ever cut into, or more bytes than its files hold, is refused before any reader is
%% spawned or any of its bytes allocated.
-module(erlcuda_shm).

-export([folder/1, remove/1, plan/3, stage/1, kept/1, release/1, done/1, delete/1,
         result_files/3, take_result/4, read_result/4, clean/1, read_parts/2, part_bytes/1]).

-export_type([folder/0, plan/0, kept/0, leftover/0]).

-include_lib("kernel/include/file.hrl").

-define(PREFIX, "erlcuda-").
%% A part's size is a multiple of this, which is a multiple of every page size the worker
%% may map parts with.
-define(PART_UNIT, (1 bsl 20)).

%% A worker's folder, the size from which a vector travels through it, and the keeper of its
%% operand slots (erlcuda_shm_slots).
-type folder() :: #{dir := file:filename(), threshold := pos_integer(), keeper => pid()}.
%% What to write: `{File, Binary}' (a job's own part file), or a slot and its parts.
-type plan() :: [{file:filename(), binary()} | {slot, erlcuda_shm_slots:slot(), [binary()]}].
%% What a job holds until it ends: its own files and its slots.
-type kept() :: [file:filename() | {slot, erlcuda_shm_slots:slot()}].
%% What a result read leaves to close and delete once its reply is sent.
-type leftover() :: {[file:fd()], [file:filename()]}.

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
%% names them (`{file, Name, Bytes, PartBytes}' for those) and the parts to write, in order.
-spec plan(folder() | none, erlcuda:job_id(), [erlcuda_job:arg()]) ->
    {[erlcuda_protocol:launch_arg()], plan()}.
plan(none, _, Args) ->
    {Args, []};
plan(#{threshold := Threshold} = Folder, JobId, Args) ->
    plan(Args, 1, Folder, Threshold, JobId, [], []).

plan([], _, _, _, _, Acc, Files) ->
    {lists:reverse(Acc), lists:append(lists:reverse(Files))};
plan([Bin | Rest], I, Folder, Threshold, JobId, Acc, Files)
  when is_binary(Bin), byte_size(Bin) >= Threshold ->
    {Name, Size, PartBytes, Parts} = parts_of(Bin, I, Folder, JobId),
    plan(Rest, I + 1, Folder, Threshold, JobId, [{file, Name, Size, PartBytes} | Acc],
         [Parts | Files]);
plan([{vector, Type, Bin} | Rest], I, Folder, Threshold, JobId, Acc, Files)
  when byte_size(Bin) >= Threshold ->
    {Name, Size, PartBytes, Parts} = parts_of(Bin, I, Folder, JobId),
    plan(Rest, I + 1, Folder, Threshold, JobId, [{file, Type, Name, Size, PartBytes} | Acc],
         [Parts | Files]);
plan([A | Rest], I, Folder, Threshold, JobId, Acc, Files) ->
    plan(Rest, I + 1, Folder, Threshold, JobId, [A | Acc], Files).

%% An operand's name and what to write: a slot where one is free or can be made, else files
%% of the job's own.
parts_of(Bin, I, #{dir := Dir} = Folder, JobId) ->
    Size = byte_size(Bin),
    PartBytes = part_bytes(Size),
    Cuts = parts(Dir, Size, PartBytes),
    case erlcuda_shm_slots:claim(Folder, PartBytes, length(Cuts)) of
        {ok, #{name := Slot} = S} ->
            {Slot, Size, PartBytes,
             [{slot, S, [binary_part(Bin, At, Len) || {_, At, Len} <- Cuts]}]};
        none ->
            Name = iolist_to_binary(["i", integer_to_list(JobId), "-", integer_to_list(I)]),
            Parts = [{Path, binary_part(Bin, At, Len)}
                     || {Path, At, Len} <- parts(filename:join(Dir, Name), Size, PartBytes)],
            {Name, Size, PartBytes, Parts}
    end.

%% @doc The bytes per part file of an operand of `Size' bytes.
-spec part_bytes(non_neg_integer()) -> pos_integer().
part_bytes(Size) ->
    max(1, ceil_div(ceil_div(Size, erlcuda_contract:shm_parts()), ?PART_UNIT)) * ?PART_UNIT.

%% The part files of a vector of Size bytes at Base: `{Path, Offset, Length}'.
parts(Base, Size, PartBytes) ->
    [{part_name(Base, K), K * PartBytes, min(PartBytes, Size - K * PartBytes)}
     || K <- lists:seq(0, max(1, ceil_div(Size, PartBytes)) - 1)].

part_name(Base, K) when is_binary(Base) ->
    <<Base/binary, ".", (integer_to_binary(K))/binary>>;
part_name(Base, K) ->
    Base ++ "." ++ integer_to_list(K).

ceil_div(A, B) ->
    (A + B - 1) div B.

%% @doc Write the planned parts, every operand's at once (each write runs on a dirty I/O
%% scheduler: the slots' writes are all asked for first, then a job's own files written,
%% then the slots' awaited); on failure, delete them all, and the slots. A job's own part is
%% a new file: one whose path is taken already (by a symlink, a FIFO, a directory, any
%% file) is an error, never written through; a slot's parts are written by the processes
%% that made them so.
-spec stage(plan()) -> ok | {error, binary()}.
stage(Plan) ->
    Asked = [{Name, erlcuda_shm_slots:send_writes(S, Bins)}
             || {slot, #{name := Name} = S, Bins} <- Plan],
    Own = [{F, B} || {F, B} <- Plan],
    %% Exclusive is O_CREAT | O_EXCL: any existing path fails with eexist, a symlink
    %% without being followed and a FIFO without being waited on.
    Written = in_parallel(fun({F, B}) -> {F, file:write_file(F, B, [raw, exclusive])} end,
                          Own),
    InSlots = [{Name, erlcuda_shm_slots:written(Refs)} || {Name, Refs} <- Asked],
    case checked(Written ++ InSlots, [F || {F, _} <- Own]) of
        ok -> ok;
        {error, _} = Error -> delete(kept(Plan)), Error
    end.

%% @doc What a job keeps until it ends, of what was planned for it.
-spec kept(plan()) -> kept().
kept(Plan) ->
    [case Item of {slot, S, _} -> {slot, S}; {F, _} -> F end || Item <- Plan].

%% @doc A job that was never registered gives back what was planned for it.
-spec release(plan()) -> ok.
release(Plan) ->
    lists:foreach(fun({slot, S, _}) -> erlcuda_shm_slots:release(S); (_) -> ok end, Plan).

%% @doc A job is answered: its slots are free for the next job, its own files deleted.
-spec done(kept()) -> ok.
done(Kept) ->
    lists:foreach(fun({slot, S}) -> erlcuda_shm_slots:release(S);
                     (F) -> _ = file:delete(F, [raw])
                  end, Kept).

%% Fun on each element, each in a process of its own (one alone runs here); the results in
%% order. Linked: they die with a caller that dies. Unlinked once done, and any 'EXIT' of a
%% caller trapping exits taken.
in_parallel(Fun, [E]) ->
    [Fun(E)];
in_parallel(Fun, List) ->
    Self = self(),
    Pids = [spawn_link(fun() -> Self ! {erlcuda_shm, self(), Fun(E)} end) || E <- List],
    Results = [receive {erlcuda_shm, Pid, R} -> R end || Pid <- Pids],
    _ = [begin
             unlink(Pid),
             receive {'EXIT', Pid, _} -> ok after 0 -> ok end
         end || Pid <- Pids],
    Results.

checked(Results, Files) ->
    case [{F, Why} || {F, {error, Why}} <- Results] of
        [] ->
            ok;
        [{File, Why} | _] ->
            delete(Files),
            {error, iolist_to_binary(io_lib:format("shared memory: writing ~ts: ~p",
                                                   [File, Why]))}
    end.

%% @doc Delete files (the parts of a job's operands or result) and slots (of a job that
%% ended while the worker may still read them); missing ones are fine.
-spec delete(kept()) -> ok.
delete(Files) ->
    lists:foreach(fun({slot, S}) -> erlcuda_shm_slots:discard(S);
                     (F) -> _ = file:delete(F, [raw])
                  end, Files).

%% @doc The part files of job `JobId''s result, as its record describes it: those a worker
%% may have written, so at most as many as a vector is ever cut into.
-spec result_files(file:filename(), erlcuda:job_id(), erlcuda_protocol:file_result()) ->
    [file:filename()].
result_files(Dir, JobId, {file, Bytes, PartBytes}) ->
    [Path || {Path, _, _} <- result_parts(Dir, JobId, Bytes, PartBytes)].

%% @doc Job `JobId''s result, read from its parts in `Dir' and deleted: the vector record
%% it stands for, or `{error, {internal, Text}}' where the record names more parts than a
%% vector is ever cut into, or a part is missing, not a regular file, or not of its length.
-spec take_result(file:filename(), erlcuda:job_id(), non_neg_integer(), pos_integer()) ->
    erlcuda_protocol:reply() | {error, erlcuda:reason()}.
take_result(Dir, JobId, Bytes, PartBytes) ->
    {Reply, Leftover} = read_result(Dir, JobId, Bytes, PartBytes),
    clean(Leftover),
    Reply.

%% @doc `take_result/4' less its last file calls: the reply at once, and what is left to
%% close and delete (`clean/1'), so that a deliverer sends the reply first and the
%% caller's wait holds only the calls that read it.
-spec read_result(file:filename(), erlcuda:job_id(), non_neg_integer(), pos_integer()) ->
    {erlcuda_protocol:reply() | {error, erlcuda:reason()}, leftover()}.
read_result(Dir, JobId, Bytes, PartBytes) ->
    Parts = result_parts(Dir, JobId, Bytes, PartBytes),
    Paths = [Path || {Path, _, _} <- Parts],
    case part_count(Bytes, PartBytes) =< erlcuda_contract:shm_parts() of
        true ->
            case read_open_parts(Parts, Bytes) of
                {ok, Bin, Fds} -> {erlcuda_protocol:vector_reply(Bin), {Fds, Paths}};
                {error, Why} -> {internal("reading the result: ~0p", [Why]), {[], Paths}}
            end;
        false ->
            {internal("a result record of ~b bytes in parts of ~b names more than ~b "
                      "parts", [Bytes, PartBytes, erlcuda_contract:shm_parts()]),
             {[], Paths}}
    end.

%% @doc Close and delete what a result read left (`read_result/4').
-spec clean(leftover()) -> ok.
clean({Fds, Paths}) ->
    _ = [file:close(Fd) || Fd <- Fds],
    delete(Paths).

internal(Format, Args) ->
    {error, {internal, iolist_to_binary(["shared memory: ", io_lib:format(Format, Args)])}}.

%% The parts of a result a worker may have written: a record's first parts, at most as many
%% as the contract lets an operand be cut into, so that a forged count makes no list, file
%% name or process of its own.
result_parts(Dir, JobId, Bytes, PartBytes) ->
    Base = result_base(Dir, JobId),
    Count = min(part_count(Bytes, PartBytes), erlcuda_contract:shm_parts()),
    [{part_name(Base, K), K * PartBytes, min(PartBytes, Bytes - K * PartBytes)}
     || K <- lists:seq(0, Count - 1)].

part_count(Bytes, PartBytes) ->
    max(1, ceil_div(Bytes, PartBytes)).

%% @doc A vector of `Bytes' bytes read from its parts (`{Path, Offset, Length}', several at
%% once): each part's `Length' bytes from the start of a regular file (not a symlink) that
%% holds at least that many, checked before anything is opened or allocated (the worker
%% writes a result into a buffer of whole MiBs, reused from job to job, and links it under
%% the result's name). Errors: `{Path, Why}' (from file:read_link_info/2 or file:open/2),
%% `{Path, not_regular, Type}', `{Path, holds, Size, expected, Length}', `{Path, replaced}'
%% (not the file checked once opened), `{size, Read, Bytes}'.
-spec read_parts([{file:filename(), non_neg_integer(), non_neg_integer()}],
                 non_neg_integer()) -> {ok, binary()} | {error, term()}.
read_parts(Parts, Bytes) ->
    case read_open_parts(Parts, Bytes) of
        {ok, Bin, Fds} -> _ = [file:close(Fd) || Fd <- Fds], {ok, Bin};
        {error, _} = Error -> Error
    end.

%% `read_parts/2' with a lone part's file left open (`{ok, Bin, Fds}'): its close waits
%% until the reply is sent. Several parts are read by processes of their own, whose files
%% close as they end.
read_open_parts(Parts, Bytes) ->
    case found(Parts, []) of
        {ok, [{Path, Len, Info}]} ->
            read(Path, Len, Info);
        {ok, Found} ->
            case read_all(Found, Bytes) of
                {ok, Bin} -> {ok, Bin, []};
                {error, _} = Error -> Error
            end;
        {error, _} = Error ->
            Error
    end.

read_all(Found, Bytes) ->
    Read = in_parallel(fun({Path, Len, Info}) -> read_closed(Path, Len, Info) end, Found),
    case [Why || {error, Why} <- Read] of
        [] ->
            Bin = iolist_to_binary([B || {ok, B} <- Read]),
            case byte_size(Bin) of
                Bytes -> {ok, Bin};
                Other -> {error, {size, Other, Bytes}}
            end;
        [Why | _] ->
            {error, Why}
    end.

%% Each part as it is in the folder, `{Path, Length, Info}': the entry itself, not what a
%% symlink names, and only a regular file of at least its length (a FIFO opened for
%% reading would block until someone writes to it).
found([], Acc) ->
    {ok, lists:reverse(Acc)};
found([{Path, _, Len} | Rest], Acc) ->
    case file:read_link_info(Path, [raw, {time, posix}]) of
        {ok, #file_info{type = regular, size = Size} = Info} when Size >= Len ->
            found(Rest, [{Path, Len, Info} | Acc]);
        {ok, #file_info{type = regular, size = Size}} ->
            {error, {Path, holds, Size, expected, Len}};
        {ok, #file_info{type = Type}} ->
            {error, {Path, not_regular, Type}};
        {error, Why} ->
            {error, {Path, Why}}
    end.

%% Raw: in this process, not through the file server that every file:read_file/1 shares.
%% The file opened must be the one checked: an entry swapped in between (for a symlink or
%% another file) is refused unread. (A FIFO swapped in would still block the open; only
%% this user can change the folder, which is mode 0700.) Read, the file is left open, for
%% the caller to close.
read(File, Bytes, Checked) ->
    case file:open(File, [read, raw, binary]) of
        {ok, Fd} ->
            Read = case same_file(file:read_file_info(Fd, [raw, {time, posix}]), Checked) of
                       true -> read_open(File, Fd, Bytes);
                       false -> {error, {File, replaced}}
                   end,
            case Read of
                {ok, Bin} -> {ok, Bin, [Fd]};
                {error, _} = Error -> _ = file:close(Fd), Error
            end;
        {error, Why} ->
            {error, {File, Why}}
    end.

read_closed(File, Bytes, Checked) ->
    case read(File, Bytes, Checked) of
        {ok, Bin, Fds} -> _ = [file:close(Fd) || Fd <- Fds], {ok, Bin};
        {error, _} = Error -> Error
    end.

%% Exactly `Bytes' into one binary (a longer read that came back short would shrink the
%% binary, which may copy it): the file may have shrunk since it was checked.
read_open(File, Fd, Bytes) ->
    case read_exactly(Fd, Bytes) of
        {ok, Bin} when byte_size(Bin) =:= Bytes -> {ok, Bin};
        {ok, Bin} -> {error, {File, holds, byte_size(Bin), expected, Bytes}};
        {error, _} = Error -> Error
    end.

same_file({ok, #file_info{type = regular, major_device = Dev, inode = Inode}},
          #file_info{major_device = Dev, inode = Inode}) ->
    true;
same_file(_, _) ->
    false.

read_exactly(_, 0) ->
    {ok, <<>>};
read_exactly(Fd, Bytes) ->
    case file:read(Fd, Bytes) of
        eof -> {ok, <<>>};
        Other -> Other
    end.

result_base(Dir, JobId) ->
    filename:join(Dir, "r" ++ integer_to_list(JobId)).
