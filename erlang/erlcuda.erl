%% @doc GPU compute for the BEAM.
%%
%% `launch/2,3' returns `{ok, JobId}' at once; the caller later receives
%% `{erlcuda, JobId, {ok, Result}}' or `{erlcuda, JobId, {error, Reason}}', exactly once.
%% `launch_sync/2,3' waits for that reply; `await/1,2' waits for the reply of a `launch'. The
%% work runs in a separate worker OS process,
%% so a crash there never takes the node down.
%%
%% Kernels (see `kernels/0'): `vector_add([A, B])', `reduce([A])', `dot_product([A, B])',
%% `matmul([A, B, M, N, K])' in f32 or f64; `copy([A])', `zeros([N])', `empty([N])' in any
%% element type; and the kernels loaded with `load/4' and `elementwise/5'. A vector is a
%% list of numbers, a little-endian binary of its element type, or a buffer.
%%
%% Element types: `f32', `f64', `i32', `u32', `i64', `u8'. Lists are converted with a range
%% check for the type (floats or integers for f32 and f64, integers for the others);
%% vector results of integer types come back as lists of integers. `launch_sync' checks the
%% range of a built-in kernel's f32 lists while the worker runs the job, and returns the
%% same `{error, {bad_args, _}}' as `launch' for a number beyond it (the job's result is
%% dropped).
%%
%% Buffers are vectors that stay on a device: `upload/2', `zeros/3', `empty/3', or any
%% launch with `{keep, true}', make them; any kernel takes one wherever it takes a vector;
%% `download/1,2' reads one back. A buffer belongs to the process that made it and is freed
%% when that process exits, or by `free/1'; `give/2' hands it to another process. A buffer
%% of a worker that has since restarted is lost: `{error, {buffer_lost, Buffer}}'.
%%
%% Options, as a list of pairs or a map: `{device, N | any}' (default 0, or the device of
%% the launch's buffers), `{format, list | binary}' (a vector result as a list of numbers
%% or a binary; default list), `{timeout, Ms}' (`launch_sync' only, default 5000, at most
%% 4294967295 or `infinity'), `{wait, Ms}' (a launch that finds its device's queue full,
%% `max_queue' jobs in flight, waits for room up to `Ms' or `infinity', behind the launches
%% already waiting there, before it answers `{error, overloaded}'; default 0, no wait; a
%% `launch_sync' waits at most its timeout), `{trace, true}' (for benchmarks: the reply
%% carries the time of each stage, `stamps()'), `{type, T}' (the element type of the vectors
%% given as data; default the type of the first buffer, else the kernel's first type, f32),
%% `{keep, true}' (vector results stay on the device: the reply carries buffers). For user
%% kernels:
%% `{grid, G}', `{block, B}' (a positive integer or a tuple of one to three), `{shared,
%% Bytes}' (dynamic shared memory), `{elements, N}' (blocks of 256 covering N; by default
%% N is the longest vector argument).
%%
%% Clustering: every node that runs erlcuda and is connected is part of the cluster.
%% `{node, Node}' runs a launch on that node (default: this node, or the node of the
%% launch's buffers), `{node, any}' on the least-loaded device of the cluster; the reply
%% comes straight from there, exactly once, or as `{error, {node_down, Node}}' when that
%% node goes down or its connection drops first. `info(cluster)' describes every node;
%% `transfer/2,3' copies a buffer to another node.
-module(erlcuda).

-export([launch/2, launch/3, launch_sync/2, launch_sync/3, await/1, await/2, info/0, info/1,
         error_codes/0, kernels/0]).
-export([upload/1, upload/2, download/1, download/2, zeros/3, empty/3, free/1, give/2,
         buffer_info/1, transfer/2, transfer/3]).
-export([load/3, load/4, elementwise/4, elementwise/5, unload/1]).
-export([program/1, program/2, run/2, run/3, run_sync/2, run_sync/3]).

%% How long a timed-out launch_sync whose job was answered already waits for that reply,
%% to free the buffers it keeps.
-define(LATE_KEEP_MS, 5000).
%% What `receive ... after' accepts.
-define(MAX_TIMEOUT, 4294967295).

-export_type([kernel/0, vector/0, device/0, format/0, option/0, options/0, job_id/0,
              result/0, reason/0, cuda_code/0, stamps/0, buffer/0, element_type/0,
              param/0, load_option/0, buffer_info/0, cluster_info/0, traced/1,
              program/0, program_spec/0, program_option/0]).

%% A built-in kernel, the name of a loaded one, or a program (`program/1,2').
-type kernel() :: erlcuda_contract:builtin_kernel() | atom() | program().
%% A program: steps run on device data in one launch (`program/1,2'); print it, send it.
-type program() :: erlcuda_program:program().
%% A program's definition: its inputs (names, or `{Name, Type}' to fix a vector's type),
%% its steps `{Name, Kernel, Args}' in order (each argument an input's or an earlier
%% step's name, `{Step, N}' for a step's Nth result, a number or a buffer) and its
%% outputs (a step's name, `{Step, N}', or a list of those); `name' names its runs.
-type program_spec() :: #{inputs := [atom() | {atom(), element_type()}],
                          steps := [{atom(), atom(), [term()]}],
                          outputs := atom() | {atom(), pos_integer()}
                                   | [atom() | {atom(), pos_integer()}],
                          name => atom()}.
-type program_option() :: {fuse, boolean()} | {graph, boolean()}.
-type element_type() :: erlcuda_contract:element_type().
%% A vector on a device: `{erlcuda_buffer, Node, Epoch, Device, Id, Type, Elements}' (print
%% it, send it; build none by hand).
-opaque buffer() :: {erlcuda_buffer, node(), non_neg_integer(), non_neg_integer(),
                     pos_integer(), element_type(), non_neg_integer()}.
%% A vector: a list of numbers, a little-endian binary of its element type, or a buffer.
-type vector() :: [number()] | binary() | buffer().
-type device() :: non_neg_integer() | any.
-type format() :: list | binary.
-type dims() :: pos_integer() | {pos_integer()} | {pos_integer(), pos_integer()}
              | {pos_integer(), pos_integer(), pos_integer()}.
-type option() :: {device, device()} | {format, format()} | {timeout, timeout()}
                | {wait, timeout()}
                | {trace, boolean()} | {type, element_type()} | {keep, boolean()}
                | {grid, dims()} | {block, dims()} | {shared, non_neg_integer()}
                | {elements, non_neg_integer()} | {node, node() | any}.
-type options() :: [option()] | #{device => device(), format => format(),
                                  timeout => timeout(), wait => timeout(),
                                  trace => boolean(),
                                  type => element_type(), keep => boolean(),
                                  grid => dims(), block => dims(),
                                  shared => non_neg_integer(),
                                  elements => non_neg_integer(),
                                  node => node() | any}.
-type job_id() :: pos_integer().
-type result() :: [number()] | binary() | float() | buffer() | [result()].
-type cuda_code() :: erlcuda_contract:cuda_code().
%% A traced job's time by stage, in nanoseconds, each stage timed on one clock: the
%% worker's `<<"decode">>' (its frame read to the job queued), `<<"queue">>' (to taken by its
%% device's thread), `<<"group">>' (to its backend call), `<<"backend">>' (the call) and
%% `<<"encode">>' (the reply's bookkeeping), on its perf_counter; the port owner's
%% `<<"forward">>' (its results frame taken up to the reply sent), on Erlang's monotonic
%% clock. A stage the job did not reach is absent; a job answered with an error on the
%% Erlang side (its worker died, say) has none.
-type stamps() :: #{binary() => non_neg_integer()}.
%% An answer with `{trace, true}': the worker's stamps beside the value or the reason.
-type traced(Value) :: {ok, Value, stamps()} | {error, reason(), stamps()}.
%% A user kernel's parameter: a pointer it reads, writes or both, or a scalar.
-type param() :: {in | out | inout, element_type()} | {scalar, element_type()}.
-type load_option() :: {options, [binary()]} | {timeout, timeout()}.
-type buffer_info() :: #{node := node(), epoch := non_neg_integer(),
                         device := non_neg_integer(), id := pos_integer(),
                         type := element_type(), elements := non_neg_integer(),
                         bytes := non_neg_integer(), owner := pid() | undefined}.
%% Every node of the cluster, this one included (`age_ms' 0): its devices, the jobs in
%% flight on each (`depths'), its backend, its worker's status (`unknown' until a new
%% node's first figure comes), the jobs it answers a second while busy (`rate', 0.0 until
%% measured), and how old the figure is.
-type cluster_info() :: #{node() => #{devices := non_neg_integer(), depths := [integer()],
                                      backend := cpu | cuda | undefined, status := term(),
                                      age_ms := non_neg_integer(), rate => float()}}.
%% `{bad_python, Detail}': no worker runs, because the Python it is configured with cannot
%% run it (not found, too old, numpy or the erlcuda package missing); Detail names the
%% interpreter, what is missing and the fix, and `info/0' shows it as the status. The
%% check runs again with a growing back-off, and the worker starts once it passes.
-type reason() :: {unknown_kernel, term()}
                | {bad_device, term()}
                | {bad_args, binary()}
                | {bad_option, term()}
                | timeout
                | overloaded
                | too_large
                | {worker_down, term()}
                | {bad_python, binary()}
                | {backend_unavailable, binary()}
                | {cuda, cuda_code(), binary()}
                | {non_finite, binary()}
                | {buffer_lost, buffer() | non_neg_integer()}
                | {wrong_device, buffer()}
                | {remote_buffer, buffer()}
                | {bad_node, node()}
                | {node_down, node()}
                | not_owner
                | {compile, binary()}
                | {already_loaded, atom()}
                | {bad_program, binary()}
                | {step, pos_integer(), reason()}
                | {internal, binary()}.

%% @equiv launch(Kernel, Args, [])
-spec launch(Kernel :: kernel(), Args :: [vector() | number()]) ->
    {ok, job_id()} | {error, reason()}.
launch(Kernel, Args) ->
    launch(Kernel, Args, []).

%% @doc Queue a job; the result is sent to the caller as `{erlcuda, JobId, Result}'
%% (`{erlcuda, JobId, Result, Stamps}' with `{trace, true}'), exactly once.
%%
%% What Erlang can check is answered at once (`{error, Reason}'); the rest arrives as the
%% reply. Every reason is listed in `reason()'.
-spec launch(Kernel :: kernel(), Args :: [vector() | number()], Opts :: options()) ->
    {ok, job_id()} | {error, reason()}.
launch(Kernel, Args, Opts) ->
    case erlcuda_remote:node_option(Opts) of
        none -> launch_here(Kernel, Args, Opts);
        {node, Node} -> here(erlcuda_remote:launch(Node, Kernel, Args, Opts, async),
                             fun(O) -> launch_here(Kernel, Args, O) end)
    end.

launch_here(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts) of
        {ok, Job} ->
            case erlcuda_submit:submit(Job, self()) of
                {ok, JobId, _} -> {ok, JobId};
                {error, _} = Error -> Error
            end;
        %% Buffers of another node of the cluster: the launch runs there.
        {error, {remote_buffer, B}} -> erlcuda_remote:follow(B, Kernel, Args, Opts, async);
        {error, {unknown_kernel, _}} = Error -> unknown_here(Error, Kernel, Args, Opts, async);
        {error, _} = Error -> Error
    end.

%% A kernel unknown here may be loaded where the launch's buffers live: where they all live
%% on one other node of the cluster, the launch runs there, which judges it (for a
%% `launch', its refusal there is the job's reply, as for any launch on another node).
unknown_here(Error, Kernel, Args, Opts, Mode) ->
    case remote_buffers(Args, none) of
        {ok, B} -> erlcuda_remote:follow(B, Kernel, Args, Opts, Mode);
        none -> Error
    end.

%% The first buffer, where every buffer among `Args' is of one other node of the cluster.
remote_buffers([{erlcuda_buffer, Node, _, _, _, _, _} = A | Rest], Found) ->
    case {erlcuda_remote:remote_node(A), Found} of
        {{remote, Node}, none} -> remote_buffers(Rest, {ok, A});
        {{remote, Node}, {ok, {erlcuda_buffer, Node, _, _, _, _, _}}} ->
            remote_buffers(Rest, Found);
        _ -> none
    end;
remote_buffers([_ | Rest], Found) ->
    remote_buffers(Rest, Found);
remote_buffers(_, Found) ->
    Found.

%% A launch with a node option that runs on this node after all.
here({local, Opts}, Run) -> Run(Opts);
here(Result, _) -> Result.

%% @equiv launch_sync(Kernel, Args, [])
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | number()]) ->
    {ok, result()} | {error, reason()}.
launch_sync(Kernel, Args) ->
    launch_sync(Kernel, Args, []).

%% @doc Run a job and wait for its result, at most `{timeout, Ms}' (default 5000).
%%
%% The reply goes to a process alias that is dropped on timeout, so a late result never
%% reaches the caller's mailbox. With `{trace, true}' the answer carries the worker's time
%% stamps as a third element: `{ok, Result, Stamps}' or `{error, Reason, Stamps}'.
-spec launch_sync(Kernel :: kernel(), Args :: [vector() | number()],
                  Opts :: options()) ->
    {ok, result()} | {error, reason()} | {ok, result(), stamps()}
    | {error, reason(), stamps()}.
launch_sync(Kernel, Args, Opts) ->
    case erlcuda_remote:node_option(Opts) of
        none -> launch_sync1(Kernel, Args, Opts);
        {node, Node} -> here(erlcuda_remote:launch(Node, Kernel, Args, Opts, sync),
                             fun(O) -> launch_sync1(Kernel, Args, O) end)
    end.

%% The f32 range of list arguments is checked once the job is on its way, while the worker
%% runs it (erlcuda_job:validate/4): a list with a number beyond the range fails the call
%% with the error validate/3 gives, and the job's reply is dropped unread. A launch whose
%% submit may wait (for room in a full queue, or for the port's writer) is checked before
%% it; one whose submit refuses it is checked before that refusal is returned: no wait or
%% refusal hides a bad argument.
launch_sync1(Kernel, Args, Opts) ->
    case erlcuda_job:validate(Kernel, Args, Opts, later) of
        {ok, #{timeout := Timeout} = Job0} ->
            {Unranged, Job} = erlcuda_job:take_unranged(Job0),
            case Unranged =/= [] andalso erlcuda_submit:may_wait(Job) of
                true ->
                    case erlcuda_job:in_range(Unranged) of
                        ok -> submit_sync(Job, [], Timeout);
                        {error, _} = Bad -> Bad
                    end;
                false ->
                    submit_sync(Job, Unranged, Timeout)
            end;
        {error, {remote_buffer, B}} ->
            erlcuda_remote:follow(B, Kernel, Args, Opts, sync);
        {error, {unknown_kernel, _}} = Error ->
            unknown_here(Error, Kernel, Args, Opts, sync);
        {error, _} = Error ->
            Error
    end.

submit_sync(Job, Unranged, Timeout) ->
    Alias = alias([explicit_unalias]),
    Deadline = erlcuda_await:deadline(Timeout),
    Keeps = case Job of
                #{general := #{keep := N}} -> N > 0;
                #{} -> false
            end,
    case erlcuda_submit:submit(Job#{deadline => Deadline}, Alias) of
        {ok, JobId, Span} ->
            Result = case erlcuda_job:in_range(Unranged) of
                         ok -> await(JobId, Alias, Deadline, Keeps);
                         {error, _} = Bad -> abandon(JobId, Alias, Keeps, Bad)
                     end,
            %% Its stop event is this process's, with the result as returned.
            ok = erlcuda_telemetry:job_stop(Span, Result),
            Result;
        {error, _} = Refused ->
            unalias(Alias),
            case erlcuda_job:in_range(Unranged) of
                ok -> Refused;
                {error, _} = Bad -> Bad
            end
    end.

%% The reply names the alias (erlcuda_jobs), never a job id: nothing else can match.
await(JobId, Alias, Deadline, Keeps) ->
    case erlcuda_await:reply(Alias, Deadline, none) of
        {ok, Result} ->
            unalias(Alias),
            Result;
        _ ->
            abandon(JobId, Alias, Keeps, {error, timeout})
    end.

%% A job whose caller returns without its reply: buffers the job was to keep must not
%% outlive the call. A job still registered is taken back (its buffers freed after it); one
%% already answered has its reply on the way or here, and the buffers in it are freed.
%% A job that keeps none stays registered while the worker holds it, so that its device's
%% count of jobs in flight stays true; its shared memory goes now all the same.
abandon(JobId, Alias, Keeps, Error) ->
    Late = case Keeps andalso erlcuda_jobs:cancel(JobId) of
               false when Keeps -> ?LATE_KEEP_MS;
               _ -> 0
           end,
    ok = erlcuda_jobs:let_go(JobId),
    %% The job's event is this caller's error, even once it is gone.
    ok = erlcuda_jobs:disown(JobId),
    erlcuda_await:drop(Alias, Late, fun erlcuda_buffers:free_all/1),
    Error.

%% @equiv await(JobId, 5000)
-spec await(JobId :: job_id()) ->
    {ok, result()} | {error, reason()} | {ok, result(), stamps()} | {error, reason(), stamps()}.
await(JobId) ->
    await(JobId, 5000).

%% @doc Wait at most `Timeout' ms (or `infinity') for the reply of a job that the calling
%% process launched with `launch/2,3', and return it: `{erlcuda, JobId, Result}' is taken
%% from the mailbox and `Result' returned (`{ok, Result, Stamps}' or `{error, Reason,
%% Stamps}' for a traced one). The job's telemetry stop event runs in the caller.
%%
%% `{error, timeout}' leaves nothing behind: a job still unanswered is dropped (it will never
%% be answered, and the buffers it was to keep are freed), so no late reply comes. A job
%% answered just as the time ran out has its reply on the way, and that reply is returned
%% instead. A job of another node is dropped there the same way. A job whose reply goes to
%% another process is `{error, {bad_args, _}}' at once; an id this process never launched,
%% or whose reply it already took, waits for the whole `Timeout'.
-spec await(JobId :: job_id(), Timeout :: timeout()) ->
    {ok, result()} | {error, reason()} | {ok, result(), stamps()} | {error, reason(), stamps()}.
await(JobId, Timeout) when is_integer(JobId), JobId > 0,
                           (Timeout =:= infinity orelse
                            (is_integer(Timeout) andalso Timeout >= 0
                             andalso Timeout =< ?MAX_TIMEOUT)) ->
    Deadline = erlcuda_await:deadline(Timeout),
    case erlcuda_await:job(JobId, Deadline) of
        not_here ->
            case erlcuda_remote:await_launch(JobId, Deadline) of
                not_remote -> erlcuda_await:answered(JobId, Deadline);
                Result -> Result
            end;
        Result ->
            Result
    end;
await(JobId, Timeout) when is_integer(JobId), JobId > 0 ->
    {error, {bad_option, {timeout, Timeout}}};
await(JobId, _) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("not a job id: ~0P", [JobId, 8]))}}.

%% @doc The backend, its devices with their counters and memory, the worker's OS pid and
%% status, its Python (`python', `python_executable', `numpy'), and the jobs counted since
%% the application started; before it starts (or once it stopped), `status => not_running'
%% and no backend. While the configured Python cannot run the worker, `status' and
%% `worker_status' are `{bad_python, Detail}'; `backoff_ms' is the delay before the next
%% start while starts keep failing.
-spec info() -> #{backend := cpu | cuda | undefined, devices := non_neg_integer(),
                  worker_os_pid := integer() | undefined, atom() => term()}.
info() ->
    try erlcuda_worker:info()
    catch exit:{noproc, _} ->
        #{backend => undefined, devices => 0, worker_os_pid => undefined,
          status => not_running}
    end.

%% @doc `info(cluster)': every node of the cluster, this one included, with its devices,
%% the jobs in flight on each (`depths', as last published), its backend, its worker's
%% status and the age of that figure (`age_ms').
-spec info(cluster) -> cluster_info() | {error, {bad_args, binary()}}.
info(cluster) ->
    erlcuda_cluster:info();
info(Other) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("info/1 takes cluster, not ~0P",
                                                      [Other, 8]))}}.

%% @doc The codes a `{cuda, Code, Message}' error can carry.
-spec error_codes() -> [cuda_code()].
error_codes() ->
    erlcuda_contract:cuda_codes().

%% @doc The kernels a launch may name: each one's parameters (`vector' of an element type,
%% or `dim', a non-negative integer; `length' names the parameters whose product is a
%% vector's length) and its result.
-spec kernels() -> [erlcuda_contract:spec()].
kernels() ->
    erlcuda_catalogue:kernels().

%% Buffers.

%% @equiv upload(Vector, [])
-spec upload(Vector :: [number()] | binary()) -> {ok, buffer()} | {error, reason()}.
upload(Vector) ->
    upload(Vector, []).

%% @doc Copy a vector to a device (`{device, N}', default 0) as a buffer of `{type, T}'
%% (default f32) owned by the caller: `launch_sync(copy, [Vector], Opts)' with `{keep, true}'.
%% With `{trace, true}' the answer carries the stamps as a third element, as launch_sync's.
-spec upload(Vector :: [number()] | binary(), Opts :: options()) ->
    {ok, buffer()} | {error, reason()} | traced(buffer()).
upload(Vector, Opts) ->
    with_options(Opts, fun(O) -> launch_sync(copy, [Vector], O ++ [{keep, true}]) end).

%% @equiv download(Buffer, [])
-spec download(Buffer :: buffer()) -> {ok, [number()] | binary()} | {error, reason()}.
download(Buffer) ->
    download(Buffer, []).

%% @doc A buffer's elements, as a list of numbers or, with `{format, binary}', a binary:
%% `launch_sync(copy, [Buffer], Opts)'. The buffer stays as it is. `{trace, true}' as for
%% `upload/2'.
-spec download(Buffer :: buffer(), Opts :: options()) ->
    {ok, [number()] | binary()} | {error, reason()} | traced([number()] | binary()).
download(Buffer, Opts) ->
    case erlcuda_buffers:is_buffer(Buffer) of
        true -> with_options(Opts, fun(O) -> launch_sync(copy, [Buffer], O ++ [{keep, false}])
                                   end);
        false -> not_a_buffer(Buffer)
    end.

%% @doc A buffer of `N' zeros of `Type' on a device (`{device, N}', default 0).
-spec zeros(Type :: element_type(), N :: non_neg_integer(), Opts :: options()) ->
    {ok, buffer()} | {error, reason()} | traced(buffer()).
zeros(Type, N, Opts) ->
    allocate(zeros, Type, N, Opts).

%% @doc A buffer of `N' elements of `Type', their values undefined (an allocation alone).
-spec empty(Type :: element_type(), N :: non_neg_integer(), Opts :: options()) ->
    {ok, buffer()} | {error, reason()} | traced(buffer()).
empty(Type, N, Opts) ->
    allocate(empty, Type, N, Opts).

allocate(Kernel, Type, N, Opts) ->
    case erlcuda_vector:is_type(Type) of
        true -> with_options(Opts, fun(O) -> launch_sync(Kernel, [N], O ++ [{type, Type},
                                                                             {keep, true}])
                                   end);
        false -> {error, {bad_args, iolist_to_binary(
                                      io_lib:format("~0P is not an element type (~w)",
                                                    [Type, 8, erlcuda_vector:types()]))}}
    end.

with_options(Opts, Fun) when is_map(Opts) -> Fun(maps:to_list(Opts));
with_options(Opts, Fun) when is_list(Opts) ->
    %% An improper list is refused here, before `++' would raise on it.
    try length(Opts) of
        _ -> Fun(Opts)
    catch
        error:badarg -> {error, {bad_option, Opts}}
    end;
with_options(Opts, _) -> {error, {bad_option, Opts}}.

not_a_buffer(Term) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("not a buffer: ~0P", [Term, 8]))}}.

%% @doc Free a buffer now (only its owner may: `{error, not_owner}' for others). A buffer
%% already freed, lost with its worker, or of a node this one is no longer connected to
%% (which freed it when the connection dropped) is `ok'.
-spec free(Buffer :: buffer()) -> ok | {error, reason()}.
free(Buffer) ->
    case erlcuda_remote:remote_node(Buffer) of
        local ->
            case Buffer of
                {erlcuda_buffer, Node, _, _, _, _, _} when Node =/= node() ->
                    case lists:member(Node, nodes()) orelse not erlcuda_buffers:is_buffer(Buffer) of
                        true -> erlcuda_buffers:free(Buffer);
                        false -> ok
                    end;
                _ ->
                    erlcuda_buffers:free(Buffer)
            end;
        {remote, Node} ->
            erlcuda_remote:free(Node, Buffer)
    end.

%% @doc Hand a buffer to another process, which owns it from now on: the buffer is freed
%% when that process exits (or its node's connection to the buffer's node drops), not when
%% the caller does. Only the owner may; a process of this node that is not alive is
%% `bad_args' (the buffer stays the caller's).
-spec give(Buffer :: buffer(), Pid :: pid()) -> ok | {error, reason()}.
give(Buffer, Pid) ->
    case erlcuda_remote:remote_node(Buffer) of
        local -> erlcuda_buffers:give(Buffer, Pid);
        {remote, Node} -> erlcuda_remote:give(Node, Buffer, Pid)
    end.

%% @doc What a buffer is: its node, device, id, element type, elements and bytes, and its
%% owner (`undefined' once it is freed or lost, and for a buffer of a node outside the
%% cluster). A buffer of another node of the cluster is asked about there.
-spec buffer_info(Buffer :: buffer()) -> buffer_info() | {error, reason()}.
buffer_info(Buffer) ->
    case erlcuda_remote:remote_node(Buffer) of
        local -> erlcuda_buffers:info(Buffer);
        {remote, Node} -> erlcuda_remote:buffer_info(Node, Buffer)
    end.

%% @equiv transfer(Buffer, Node, [])
-spec transfer(Buffer :: buffer(), Node :: node()) -> {ok, buffer()} | {error, reason()}.
transfer(Buffer, Node) ->
    transfer(Buffer, Node, []).

%% @doc A copy of `Buffer' on `Node' (a node of the cluster, or this one), owned by the
%% caller; the buffer stays as it is. It is downloaded from its node and uploaded to
%% `Node' (when `Node' is the buffer's own node, copied on the device instead). Options: `{device, N}' on `Node'
%% (default 0), `{timeout, Ms}' for each step (default 5000).
-spec transfer(Buffer :: buffer(), Node :: node(), Opts :: options()) ->
    {ok, buffer()} | {error, reason()}.
transfer({erlcuda_buffer, From, _, _, _, Type, _} = Buffer, Node, Opts0) when is_atom(Node) ->
    case erlcuda_buffers:is_buffer(Buffer) andalso with_options(Opts0, fun(O) -> O end) of
        false ->
            not_a_buffer(Buffer);
        {error, _} = Error ->
            Error;
        Opts ->
            Rest = erlcuda_remote:without_node(Opts),
            case From =:= Node andalso not lists:keymember(device, 1, Rest) of
                true ->
                    %% On its own node: a copy on its device.
                    launch_sync(copy, [Buffer], Rest ++ [{keep, true}, {node, Node}]);
                false ->
                    Timeout = [T || {timeout, _} = T <- Rest],
                    case download(Buffer, [{format, binary} | Timeout]) of
                        {ok, Bin} ->
                            launch_sync(copy, [Bin], Rest ++ [{type, Type}, {keep, true},
                                                              {node, Node}]);
                        {error, _} = Error ->
                            Error
                    end
            end
    end;
transfer({erlcuda_buffer, _, _, _, _, _, _} = Buffer, Node, _) ->
    case erlcuda_buffers:is_buffer(Buffer) of
        true -> {error, {bad_option, {node, Node}}};
        false -> not_a_buffer(Buffer)
    end;
transfer(Buffer, _, _) ->
    not_a_buffer(Buffer).

%% User kernels.

%% @equiv load(Module, Source, Kernels, [])
-spec load(Module :: atom(), Source :: iodata(), Kernels :: [{atom(), [param()]}]) ->
    ok | {error, reason()}.
load(Module, Source, Kernels) ->
    load(Module, Source, Kernels, []).

%% @doc Compile CUDA C `Source' (with nvcc, cached by source, options and the GPU's compute
%% capability; on the cpu backend with g++, for the host, where a kernel's threads run one
%% after another) and load it as `Module', declaring its kernels: `[{Name, Params}]', `Name'
%% an `extern "C"' function of the source and the name launches use, each param a pointer
%% `{in | out | inout, Type}' or a `{scalar, Type}'. A launch passes, in param order, a
%% vector, a buffer (used in place) or, for `out' and `inout', a count N (N zeroed
%% elements) for each pointer, and a number for each scalar; its reply is `{ok, [Value]}',
%% one value per written pointer passed as data or a count (a buffer with `{keep, true}').
%%
%% Options: `{options, [NvccFlag]}' (from an allow-list: macro definitions of safe names
%% and values, `-O0'..`-O3' and the precision and language flags docs/guide.md lists; any
%% other flag is `{error, {bad_option, {options, Flag}}}' before nvcc runs), `{timeout,
%% Ms}' (default 120000). Loading a module of
%% the same name replaces it; a new worker (after a crash) loads every module again before
%% it takes jobs. Errors: `{compile, Log}' (the compiler's message), `{backend_unavailable,
%% Text}' (no compiler, a cuda backend without a GPU, or on the cpu backend a source that
%% needs a block's threads to run together: shared memory, barriers, atomics, warp
%% intrinsics; `Text' names what and where), `{already_loaded, Name}' (a kernel name of
%% another module or a built-in one), `{bad_args, Text}'.
-spec load(Module :: atom(), Source :: iodata(), Kernels :: [{atom(), [param()]}],
           Opts :: [load_option()]) -> ok | {error, reason()}.
load(Module, Source, Kernels, Opts) ->
    case erlcuda_loader:declare(Module, Source, Kernels, Opts) of
        {ok, Declaration, Timeout} -> erlcuda_loader:load(Declaration, Timeout);
        {error, _} = Error -> Error
    end.

%% @equiv elementwise(Name, Inputs, Outputs, Operation, [])
-spec elementwise(Name :: atom(),
                  Inputs :: [{atom(), element_type() | {scalar, element_type()}}],
                  Outputs :: [{atom(), element_type()}], Operation :: iodata()) ->
    ok | {error, reason()}.
elementwise(Name, Inputs, Outputs, Operation) ->
    elementwise(Name, Inputs, Outputs, Operation, []).

%% @doc Write, compile and load a kernel `Name' that runs the C statement `Operation' for
%% every element: `Inputs' are vectors `{Var, Type}' (all of one length) and scalars
%% `{Var, {scalar, Type}}', `Outputs' vectors `{Var, Type}' of that length, each read or
%% written as the plain name `Var' (e.g. `<<"z = a * x + y">>'). A launch passes the inputs
%% in order (vectors, buffers, numbers); the reply is the output (`{ok, Value}'), or with
%% several outputs `{ok, [Value]}' (buffers with `{keep, true}'). Options and errors as
%% for `load/4'; the kernel is a module named `Name'.
-spec elementwise(Name :: atom(),
                  Inputs :: [{atom(), element_type() | {scalar, element_type()}}],
                  Outputs :: [{atom(), element_type()}], Operation :: iodata(),
                  Opts :: [load_option()]) -> ok | {error, reason()}.
elementwise(Name, Inputs, Outputs, Operation, Opts) ->
    case erlcuda_loader:declare_elementwise(Name, Inputs, Outputs, Operation, Opts) of
        {ok, Declaration, Timeout} -> erlcuda_loader:load(Declaration, Timeout);
        {error, _} = Error -> Error
    end.

%% @doc Drop a loaded module: its kernels leave the catalogue and the worker forgets it.
%% A module that is not loaded is `ok'.
-spec unload(Module :: atom()) -> ok | {error, reason()}.
unload(Module) ->
    erlcuda_loader:unload(Module).

%% Programs.

%% @equiv program(Spec, [])
-spec program(Spec :: program_spec()) -> {ok, program()} | {error, {bad_program, binary()}}.
program(Spec) ->
    program(Spec, []).

%% @doc A program: many kernels on device data, run in one launch (`run/3', `run_sync/3').
%%
%% `Spec' names the inputs, the steps in order and the outputs (see `program_spec()'); a
%% step is a built-in `vector_add', `reduce', `dot_product' or `matmul', or a kernel loaded
%% with `load/4' or `elementwise/5', on arguments that name inputs, earlier steps' results,
%% numbers or buffers. A program never writes its inputs: a loaded kernel's `out' param
%% takes a count (N zeroed elements), an `inout' one a count or a value (a copy of it), and
%% its results are its written vectors in order. What can be known now is checked now
%% (`{error, {bad_program, Text}}'): names, order (a step names only what comes before it,
%% so there is no cycle), arity, each argument's kind, the outputs. Element types and
%% lengths follow from a run's inputs and are checked before anything runs.
%%
%% Options: `{fuse, false}' (consecutive elementwise steps are otherwise one generated
%% kernel on a GPU), `{graph, false}' (a run repeated with the same shapes is otherwise
%% replayed as a CUDA graph where the worker has `cuda-bindings').
-spec program(Spec :: program_spec(), Opts :: [program_option()] | map()) ->
    {ok, program()} | {error, {bad_program, binary()}}.
program(Spec, Opts) ->
    erlcuda_program:new(Spec, Opts).

%% @equiv run(Program, Inputs, [])
-spec run(Program :: program(), Inputs :: [vector() | number()]) ->
    {ok, job_id()} | {error, reason()}.
run(Program, Inputs) ->
    run(Program, Inputs, []).

%% @doc Run a program on `Inputs' (in the order of its inputs: vectors, buffers, numbers):
%% `launch/3' of the program. The reply, `{erlcuda, RunId, {ok, Outputs}}', carries its
%% outputs (a list, or the one output where the spec named one without a list: vectors as
%% `format' says, scalars as floats, buffers with `{keep, true}'), all of them or an error:
%% `{step, Index, Reason}' for a step that refuses these inputs (Index from 1), else as a
%% launch's. Options as `launch/3' (`{type, T}' for vector inputs given as lists).
-spec run(Program :: program(), Inputs :: [vector() | number()], Opts :: options()) ->
    {ok, job_id()} | {error, reason()}.
run(Program, Inputs, Opts) ->
    case erlcuda_program:is_program(Program) of
        true -> launch(Program, Inputs, Opts);
        false -> not_a_program(Program)
    end.

%% @equiv run_sync(Program, Inputs, [])
-spec run_sync(Program :: program(), Inputs :: [vector() | number()]) ->
    {ok, result()} | {error, reason()}.
run_sync(Program, Inputs) ->
    run_sync(Program, Inputs, []).

%% @doc Run a program and wait for its outputs: `launch_sync/3' of the program.
-spec run_sync(Program :: program(), Inputs :: [vector() | number()], Opts :: options()) ->
    {ok, result()} | {error, reason()} | {ok, result(), stamps()}
    | {error, reason(), stamps()}.
run_sync(Program, Inputs, Opts) ->
    case erlcuda_program:is_program(Program) of
        true -> launch_sync(Program, Inputs, Opts);
        false -> not_a_program(Program)
    end.

not_a_program(Term) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("not a program: ~0P", [Term, 8]))}}.
