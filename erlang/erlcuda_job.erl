%% @private
%% Checking a launch (kernel, arguments, options) against the kernel's spec in the
%% catalogue and packing its vectors. Runs in the caller's process.
%%
%% A plain launch (a built-in kernel, f32 data, none of the options of buffers and user
%% kernels) comes out in its least form, which the submit path and the wire encode with the
%% least work: f32 vectors as binaries, dims as integers, and no `general' key. Anything
%% else carries `general': what the submit path and the reply need besides the arguments
%% (how many results stay on the device, the buffers it uses, a user kernel's launch shape
%% and the shape of its reply).
-module(erlcuda_job).

-export([validate/3, validate/4, take_unranged/1, in_range/1]).

-export_type([job/0, general/0, arg/0, geometry/0]).

-type job() :: #{kernel := atom(),
                 args := [arg()],
                 device := erlcuda:device(),
                 format := erlcuda:format(),
                 timeout := timeout(),
                 trace := boolean(),
                 result_bytes := non_neg_integer(),
                 %% what its reply must be, where the launch says (erlcuda_protocol:fits/2)
                 expect => erlcuda_protocol:expect(),
                 general => general(),
                 %% launch_sync's: when a caller waiting on a busy writer gives up
                 deadline => integer() | infinity,
                 %% how long a launch waits for room in a full queue (erlcuda_room)
                 wait => pos_integer() | infinity,
                 %% a user kernel's result bytes (telemetry; others have `expect')
                 bytes_out => non_neg_integer(),
                 %% erlcuda_transports': its vectors through this transport whatever their size,
                 %% and the job neither counted nor sent as telemetry
                 transport => pipe | shm,
                 quiet => true,
                 %% `validate/4' with `later': the f32 lists packed without their range
                 %% check, by argument name, for `in_range/1' once the job is submitted
                 unranged => [{binary(), list()}]}.
%% A launch's argument as the wire takes it: an f32 vector (a binary), a dim, or one of
%% the general path's kinds.
-type arg() :: binary() | non_neg_integer()
             | {vector, erlcuda_vector:type(), binary()}
             | {handle, erlcuda_buffers:id()}
             | {scalar, erlcuda_vector:type(), <<_:64>>}
             | {empty, erlcuda_vector:type(), non_neg_integer()}.
-type geometry() :: {{pos_integer(), pos_integer(), pos_integer()},
                     {pos_integer(), pos_integer(), pos_integer()}, non_neg_integer()}.
-type general() :: #{keep := non_neg_integer(),
                     buffers := [erlcuda:buffer()],
                     shape := erlcuda_protocol:shape(),
                     geometry => geometry(),
                     program => binary()}.

%% What `receive ... after' accepts.
-define(MAX_TIMEOUT, 4294967295).
-define(U32, 16#FFFFFFFF).
-define(DEFAULT_BLOCK, 256).
-define(GEOMETRY_OPTIONS, [grid, block, shared, elements]).

%% @doc Check a launch and pack its vectors as little-endian binaries of their element type.
-spec validate(Kernel :: term(), Args :: term(), Opts :: term()) ->
    {ok, job()} | {error, erlcuda:reason()}.
validate(Kernel, Args, Opts) ->
    validate(Kernel, Args, Opts, now).

%% @doc `validate/3', where `later' leaves the f32 range check of a built-in kernel's list
%% arguments to `in_range/1' (the job carries them as `unranged'): a caller that waits for
%% the reply runs that check while the worker runs the job, rather than before. A launch
%% refused at once is refused as `validate/3' refuses it: the first bad argument in order
%% is named, whatever is wrong with it.
-spec validate(Kernel :: term(), Args :: term(), Opts :: term(), now | later) ->
    {ok, job()} | {error, erlcuda:reason()}.
validate(Kernel, Args, Opts, now) ->
    checked(Kernel, Args, Opts, now);
validate(Kernel, Args, Opts, later) ->
    case checked(Kernel, Args, Opts, later) of
        {ok, _} = Ok -> Ok;
        {error, _} -> checked(Kernel, Args, Opts, now)
    end.

checked(Kernel, Args, Opts, Range) ->
    case options(Opts) of
        %% The options added for buffers and user kernels come apart (X): a plain launch
        %% has none.
        {ok, {Job, X}} ->
            case {erlcuda_program:is_program(Kernel), Kernel} of
                {true, _} -> program(Kernel, Args, Job, X);
                {false, {erlcuda_program, _}} -> bad("not a program: ~0P", [Kernel, 8]);
                {false, _} -> kernel(Kernel, Args, Job, X, Range)
            end;
        {error, _} = Error ->
            Error
    end.

kernel(Kernel, Args, Job, X, Range) ->
    case erlcuda_catalogue:lookup(Kernel) of
        {ok, #{user := _} = Spec} -> user(Spec, Args, Job#{kernel => Kernel}, X);
        {ok, Spec} -> builtin(Spec, Args, Job#{kernel => Kernel}, X, Range);
        error -> {error, {unknown_kernel, Kernel}}
    end.

%% Options: a proper list of pairs, or a map. The four every launch reads (device, format,
%% timeout, trace) have defaults and go into the job; the others into a map of their own,
%% only where given, so a plain launch carries nothing it does not use.
options(Opts) when is_map(Opts) ->
    options(maps:to_list(Opts));
options([]) ->
    {ok, {#{device => 0, format => list, timeout => 5000, trace => false}, #{}}};
options(Opts) ->
    Default = {#{device => 0, format => list, timeout => 5000, trace => false}, #{}},
    case proper_list(Opts) of
        true -> lists:foldl(fun(_, {error, _} = E) -> E;
                               (Opt, {ok, {Job, X}}) -> option(Opt, Job, X)
                            end, {ok, Default}, Opts);
        false -> {error, {bad_option, Opts}}
    end.

option({device, N}, Job, X) when is_integer(N), N >= 0; N =:= any ->
    {ok, {Job#{device := N}, X#{device_given => true}}};
option({format, F}, Job, X) when F =:= list; F =:= binary -> {ok, {Job#{format := F}, X}};
option({timeout, T}, Job, X) when is_integer(T), T >= 0, T =< ?MAX_TIMEOUT; T =:= infinity ->
    {ok, {Job#{timeout := T}, X}};
option({trace, B}, Job, X) when is_boolean(B) -> {ok, {Job#{trace := B}, X}};
option({wait, 0}, Job, X) -> {ok, {maps:remove(wait, Job), X}};
option({wait, W}, Job, X) when is_integer(W), W > 0, W =< ?MAX_TIMEOUT; W =:= infinity ->
    {ok, {Job#{wait => W}, X}};
option({device, N}, _, _) -> {error, {bad_device, N}};
option({type, T} = Opt, Job, X) ->
    case erlcuda_vector:is_type(T) of
        true -> {ok, {Job, X#{type => T}}};
        false -> {error, {bad_option, Opt}}
    end;
option({keep, B}, Job, X) when is_boolean(B) -> {ok, {Job, X#{keep => B}}};
option({grid, G} = Opt, Job, X) -> dims_option(grid, G, Opt, Job, X);
option({block, B} = Opt, Job, X) -> dims_option(block, B, Opt, Job, X);
option({shared, S} = Opt, Job, X) when is_integer(S), S >= 0, S =< ?U32 ->
    {ok, {Job, X#{shared => {S, Opt}}}};
option({elements, N} = Opt, Job, X) when is_integer(N), N >= 0 ->
    {ok, {Job, X#{elements => {N, Opt}}}};
option(Opt, _, _) -> {error, {bad_option, Opt}}.

dims_option(Key, Value, Opt, Job, X) ->
    case dims(Value) of
        {ok, Dims} -> {ok, {Job, X#{Key => {Dims, Opt}}}};
        error -> {error, {bad_option, Opt}}
    end.

%% A pos integer or a tuple of 1 to 3 of them, each within 32 bits, as {X, Y, Z}.
dims(X) when is_integer(X) -> dims({X});
dims({X}) -> dims({X, 1, 1});
dims({X, Y}) -> dims({X, Y, 1});
dims({X, Y, Z} = D) when is_integer(X), X > 0, X =< ?U32, is_integer(Y), Y > 0, Y =< ?U32,
                         is_integer(Z), Z > 0, Z =< ?U32 ->
    {ok, D};
dims(_) -> error.

%% Built-in kernels.

builtin(#{name := Kernel} = Spec, Args, Job, X, Range) ->
    case geometry_options(X) of
        [Opt | _] -> {error, {bad_option, Opt}};
        [] ->
            case arity(Kernel, length(maps:get(params, Spec)), Args) of
                ok -> builtin_args(Spec, Args, Job, X, Range);
                {error, _} = Error -> Error
            end
    end.

%% A launch shape is for user kernels.
geometry_options(X) when map_size(X) =:= 0 -> [];
geometry_options(X) -> [Opt || K <- ?GEOMETRY_OPTIONS, {_, Opt} <- [maps:get(K, X, none)]].

arity(Kernel, Arity, Args) ->
    case proper_list(Args) andalso length(Args) of
        false -> bad("~p expects a list of arguments", [Kernel]);
        Arity -> ok;
        N -> bad("~p takes ~s, got ~b", [Kernel, counted(Arity, "argument"), N])
    end.

%% The launch's element type: {type, T}, else its first buffer's, else the kernel's first.
builtin_args(#{name := Kernel, params := Params, result := Result} = Spec, Args, Job, X,
             Range) ->
    #{types := Types, general := General} = Spec,
    Type = case X of
               #{type := T} -> T;
               #{} -> buffer_type(Args, Types)
           end,
    case lists:member(Type, Types) of
        false ->
            bad("~p runs in ~ts, not ~p", [Kernel, type_names(Types), Type]);
        true ->
            How = {Type, General, Range},
            case values(Params, Args, How, #{}, [], []) of
                {ok, Values, Buffers, []} ->
                    check(Params, Result, Values, Buffers, Type, Job, X);
                {ok, Values, Buffers, Unranged} ->
                    case check(Params, Result, Values, Buffers, Type, Job, X) of
                        {ok, Job1} -> {ok, Job1#{unranged => Unranged}};
                        {error, _} = Error -> Error
                    end;
                {error, _} = Error ->
                    Error
            end
    end.

buffer_type([{erlcuda_buffer, _, _, _, _, T, _} = B | Rest], Types) ->
    case erlcuda_buffers:is_buffer(B) of
        true -> T;
        false -> buffer_type(Rest, Types)
    end;
buffer_type([_ | Rest], Types) -> buffer_type(Rest, Types);
buffer_type([], [T | _]) -> T.

type_names([T]) -> atom_to_list(T);
type_names(Types) -> lists:join(" or ", [atom_to_list(T) || T <- Types]).

%% Each argument checked against its param, by name: `{vector, Elements, Arg}' or
%% `{dim, N, Arg}', Arg as the wire takes it; with the buffers met, in order, and the f32
%% lists whose range check comes later (How's range `later').
values([], [], _, Acc, Buffers, Unranged) ->
    {ok, Acc, lists:reverse(Buffers), lists:reverse(Unranged)};
values([#{kind := vector, name := Name} | Ps], [A | As], {f32, _, later} = How, Acc, Buffers,
       Unranged) when is_list(A) ->
    case erlcuda_vector:pack_unranged(f32, A) of
        {ok, Packed} ->
            case vector(Packed, Name, f32) of
                {ok, Bin} ->
                    V = {vector, byte_size(Bin) div 4, Bin},
                    values(Ps, As, How, Acc#{Name => V}, Buffers, [{Name, A} | Unranged]);
                {error, _} = Error ->
                    Error
            end;
        {error, Why} ->
            bad("~s: ~ts", [Name, Why])
    end;
values([#{name := Name} = P | Ps], [A | As], {Type, General, _} = How, Acc, Buffers,
       Unranged) ->
    case value(P, A, Type, General) of
        {ok, {buffer, B, V}} -> values(Ps, As, How, Acc#{Name => V}, [B | Buffers], Unranged);
        {ok, V} -> values(Ps, As, How, Acc#{Name => V}, Buffers, Unranged);
        {error, _} = Error -> Error
    end.

value(#{kind := vector, name := Name}, {erlcuda_buffer, _, _, _, _, _, _} = A, Type, _) ->
    case erlcuda_buffers:is_buffer(A) of
        true -> buffer_value(A, Name, Type);
        false -> data_value(A, Name, Type)
    end;
value(#{kind := vector, name := Name}, A, Type, _) ->
    data_value(A, Name, Type);
value(#{kind := dim, name := Name}, A, Type, General) ->
    Max = erlcuda_contract:max_elements(),
    case is_integer(A) andalso A >= 0 andalso A =< Max of
        %% A general kernel's count (zeros, empty) travels with the launch's type.
        true when General -> {ok, {dim, A, {empty, Type, A}}};
        true -> {ok, {dim, A, A}};
        false -> bad("~s must be an integer from 0 to ~b", [Name, Max])
    end.

buffer_value({erlcuda_buffer, Node, _, _, Id, T, N} = B, Name, Type) ->
    if
        Node =/= node() -> {error, {remote_buffer, B}};
        T =/= Type -> bad("~s is a buffer of ~p; this launch runs in ~p", [Name, T, Type]);
        true ->
            %% Its length decides the result's size: only a handle erlcuda made is read.
            case erlcuda_buffers:verify(B) of
                ok -> {ok, {buffer, B, {vector, N, {handle, Id}}}};
                {error, _} = Error -> Error
            end
    end.

data_value(A, Name, Type) ->
    case vector(A, Name, Type) of
        {ok, Bin} ->
            N = byte_size(Bin) div erlcuda_vector:size(Type),
            {ok, {vector, N, wire_vector(Type, Bin)}};
        {error, _} = Error ->
            Error
    end.

%% f32 vectors stay plain binaries: a plain binary argument is the wire's f32 vector, so the
%% common launch needs no tuple.
wire_vector(f32, Bin) -> Bin;
wire_vector(Type, Bin) -> {vector, Type, Bin}.

%% The length rules, the device, then the arguments in order.
check(Params, Result, Values, Buffers, Type, Job, X) ->
    Bad = [E || #{kind := vector, name := Name, length := [_ | _] = Length} <- Params,
                {error, _} = E <- [length_rule(Name, Length, Values)]],
    case Bad of
        [E | _] ->
            E;
        [] ->
            Args = [arg(maps:get(Name, Values)) || #{name := Name} <- Params],
            case device(Buffers, Job, X) of
                {ok, Job1} -> result(Result, Values, Buffers, Type, Job1#{args => Args}, X);
                {error, _} = Error -> Error
            end
    end.

length_rule(Name, Length, Values) ->
    {vector, Have, _} = maps:get(Name, Values),
    case {Have =:= product(Length, Values), Length} of
        {true, _} -> ok;
        {false, [Other]} ->
            case maps:get(Other, Values) of
                {vector, N, _} ->
                    bad("length mismatch: ~s has ~s, ~s has ~b",
                        [Other, counted(N, "element"), Name, Have]);
                {dim, N, _} ->
                    bad("~s has ~s, ~s = ~b", [Name, counted(Have, "element"), Other, N])
            end;
        {false, _} ->
            bad("~s has ~s, ~s = ~b", [Name, counted(Have, "element"), lists:join("*", Length),
                                       product(Length, Values)])
    end.

%% A result that no reply frame could carry is refused before any work is done. Only an f32
%% vector result coming back as data may travel through shared memory (result_bytes).
result(#{kind := vector, length := [_ | _] = Length}, Values, Buffers, Type, Job, X) ->
    Size = erlcuda_vector:size(Type),
    Keep = maps:get(keep, X, false),
    Max = min(erlcuda_contract:max_elements(), erlcuda_protocol:max_result_bytes() div Size),
    case product(Length, Values) of
        N when N > Max, not Keep -> {error, too_large};
        N ->
            Bytes = case Type =:= f32 andalso not Keep of
                        true -> N * Size;
                        false -> 0
                    end,
            Expect = case Keep of
                         true -> any;
                         false -> {vector, Type, N}
                     end,
            general(Job#{result_bytes => Bytes, expect => Expect}, Buffers,
                    case Keep of true -> 1; false -> 0 end)
    end;
result(#{kind := scalar}, _, Buffers, _, Job, _) ->
    general(Job#{result_bytes => 0, expect => scalar}, Buffers, 0);
result(_, _, Buffers, _, Job, _) ->
    general(Job#{result_bytes => 0}, Buffers, 0).

%% A launch with results kept or buffers used carries what its submit and reply need.
general(Job, [], 0) ->
    {ok, Job};
general(Job, Buffers, Keep) ->
    {ok, Job#{general => #{keep => Keep, buffers => Buffers, shape => value}}}.

product(Names, Values) ->
    lists:foldl(fun(Name, Acc) ->
                        case maps:get(Name, Values) of
                            {vector, N, _} -> Acc * N;
                            {dim, N, _} -> Acc * N
                        end
                end, 1, Names).

arg({_, _, Arg}) -> Arg.

%% The launch runs on its buffers' device: all of them on one, the one {device, N} names
%% if given.
device([], Job, _) ->
    {ok, Job};
device([{erlcuda_buffer, _, _, Dev, _, _, _} | _] = Buffers, #{device := Want} = Job, X) ->
    case [B || {erlcuda_buffer, _, _, D, _, _, _} = B <- Buffers, D =/= Dev] of
        [Other | _] ->
            {error, {wrong_device, Other}};
        [] when Want =:= any; not is_map_key(device_given, X) ->
            {ok, Job#{device := Dev}};
        [] when Want =:= Dev ->
            {ok, Job};
        [] ->
            {error, {wrong_device, hd(Buffers)}}
    end.

vector(Bin, Name, Type) when is_binary(Bin) ->
    Size = erlcuda_vector:size(Type),
    Max = erlcuda_contract:max_elements(),
    case byte_size(Bin) rem Size of
        0 when byte_size(Bin) div Size > Max -> {error, too_large};
        0 -> {ok, Bin};
        _ -> bad("~s: binary of ~b bytes is not a multiple of ~b", [Name, byte_size(Bin), Size])
    end;
vector(List, Name, Type) when is_list(List) ->
    case erlcuda_vector:pack(Type, List) of
        {ok, Bin} -> vector(Bin, Name, Type);
        {error, Why} -> bad("~s: ~ts", [Name, Why])
    end;
vector(Other, Name, Type) ->
    bad("~s: expected a list of numbers, a ~p binary or a buffer, got ~0P",
        [Name, Type, Other, 8]).

%% Programs (erlcuda_program): a run passes the inputs, then the buffers the steps name.

program(Program, Args, Job, X) ->
    Inputs = erlcuda_program:inputs(Program),
    case geometry_options(X) of
        [Opt | _] ->
            {error, {bad_option, Opt}};
        [] ->
            case arity(erlcuda_program:name(Program), length(Inputs), Args) of
                ok -> program_values(Program, Inputs, Args, Job, X);
                {error, _} = Error -> Error
            end
    end.

program_values(Program, Inputs, Args, Job, X) ->
    Baked = erlcuda_program:baked(Program),
    Buffers = [B || {B, _} <- Baked],
    Type = maps:get(type, X, buffer_type(Args ++ Buffers, [f32])),
    Uses = [U || {_, U} <- Inputs] ++ [{vector, T} || {_, T} <- Baked],
    Names = [atom_to_list(N) || {N, _} <- Inputs] ++ ["a buffer of a step" || _ <- Baked],
    case program_args(lists:zip3(Uses, Names, Args ++ Buffers), Type, [], []) of
        {ok, Wire, Used} -> program_job(Program, Wire, Used, Job, X);
        {error, _} = Error -> Error
    end.

program_args([], _, Acc, Buffers) ->
    {ok, lists:reverse(Acc), lists:reverse(Buffers)};
program_args([{Use, Name, A} | Rest], Type, Acc, Buffers) ->
    case program_arg(Use, Name, A, Type) of
        {ok, {buffer, B, Wire}} -> program_args(Rest, Type, [Wire | Acc], [B | Buffers]);
        {ok, Wire} -> program_args(Rest, Type, [Wire | Acc], Buffers);
        {error, _} = Error -> Error
    end.

program_arg(dim, Name, A, _) ->
    Max = erlcuda_contract:max_elements(),
    case is_integer(A) andalso A >= 0 andalso A =< Max of
        true -> {ok, A};
        false -> bad("~s must be an integer from 0 to ~b", [Name, Max])
    end;
program_arg({scalar, T}, Name, A, _) ->
    case erlcuda_vector:scalar(T, A) of
        {ok, Bytes} -> {ok, {scalar, T, Bytes}};
        {error, Why} -> bad("~s (a ~p scalar): ~ts", [Name, T, Why])
    end;
program_arg(Use, Name, A, Type) ->
    T = case Use of {vector, Fixed} -> Fixed; vector -> Type end,
    case erlcuda_buffers:is_buffer(A) of
        true ->
            case buffer_value(A, Name, element(6, A)) of
                {ok, {buffer, B, {vector, _, Arg}}} when Use =:= vector; element(6, A) =:= T ->
                    {ok, {buffer, B, Arg}};
                {ok, _} ->
                    bad("~s is a buffer of ~p; the program takes ~p", [Name, element(6, A), T]);
                {error, _} = Error -> Error
            end;
        false ->
            case data_value(A, Name, T) of
                {ok, {vector, _, Arg}} -> {ok, Arg};
                {error, _} = Error -> Error
            end
    end.

program_job(Program, Wire, Buffers, Job, X) ->
    Outputs = erlcuda_program:outputs(Program),
    Keep = case maps:get(keep, X, false) of
               true -> length([vector || vector <- Outputs]);
               false -> 0
           end,
    case device(Buffers, Job, X) of
        {ok, Job1} ->
            {ok, Job1#{kernel => erlcuda_program:name(Program), args => Wire,
                       result_bytes => 0, expect => {list, length(Outputs)},
                       general => #{keep => Keep, buffers => Buffers,
                                    shape => erlcuda_program:shape(Program),
                                    program => erlcuda_program:definition(Program)}}};
        {error, _} = Error ->
            Error
    end.

%% User kernels: a raw one (`load/4') or an elementwise one (`elementwise/5').

user(#{name := Kernel, params := Params, user := Kind} = Spec, Args, Job, X) ->
    case arity(Kernel, length(Params), Args) of
        ok ->
            case user_values(Params, Args, 1, [], []) of
                {ok, Values, Buffers} -> user_check(Kind, Spec, Values, Buffers, Job, X);
                {error, _} = Error -> Error
            end;
        {error, _} = Error ->
            Error
    end.

%% Each argument against its param: `{Arg, Elements | scalar, Returned}', Returned whether
%% the reply carries it (a written pointer passed as data or as a count).
user_values([], [], _, Acc, Buffers) ->
    {ok, lists:reverse(Acc), lists:reverse(Buffers)};
user_values([P | Ps], [A | As], I, Acc, Buffers) ->
    Name = param_name(P, I),
    case user_value(P, A, Name) of
        {ok, {buffer, B, V}} -> user_values(Ps, As, I + 1, [V | Acc], [B | Buffers]);
        {ok, V} -> user_values(Ps, As, I + 1, [V | Acc], Buffers);
        {error, _} = Error -> Error
    end.

param_name(#{name := Name}, _) -> Name;
param_name(_, I) -> io_lib:format("argument ~b", [I]).

user_value(#{kind := scalar, type := Type}, A, Name) ->
    case erlcuda_vector:scalar(Type, A) of
        {ok, Bytes} -> {ok, {{scalar, Type, Bytes}, scalar, false}};
        {error, Why} -> bad("~ts (a ~p scalar): ~ts", [Name, Type, Why])
    end;
user_value(#{kind := vector, type := Type, access := Access}, A, Name) ->
    Written = Access =/= in,
    Max = erlcuda_contract:max_elements(),
    case erlcuda_buffers:is_buffer(A) of
        true ->
            case buffer_value(A, Name, Type) of
                {ok, {buffer, B, {vector, N, Arg}}} -> {ok, {buffer, B, {Arg, N, false}}};
                {error, _} = Error -> Error
            end;
        false when is_integer(A), Written, A >= 0, A =< Max ->
            {ok, {{empty, Type, A}, A, true}};
        false when is_integer(A), Written ->
            bad("~ts: a count must be an integer from 0 to ~b", [Name, Max]);
        false when is_integer(A) ->
            bad("~ts is read by the kernel: a vector or a buffer, not a count", [Name]);
        false ->
            case data_value(A, Name, Type) of
                {ok, {vector, N, Arg}} -> {ok, {Arg, N, Written}};
                {error, _} = Error -> Error
            end
    end.

user_check(Kind, #{name := Kernel} = Spec, Values, Buffers, Job, X) ->
    Lengths = [N || {_, N, _} <- Values, is_integer(N)],
    case lengths(Kind, Lengths) of
        {error, _} = Error ->
            Error;
        {ok, Elements} ->
            {Results, Shape} = case Kind of
                                   raw -> {[{T, N} || {{_, T, _}, N, true} <- Values], list};
                                   elementwise -> outputs(Spec, Elements)
                               end,
            Keep = maps:get(keep, X, false),
            Bytes = lists:sum([N * erlcuda_vector:size(T) || {T, N} <- Results]),
            case geometry(X, Elements) of
                {error, _} = Error ->
                    Error;
                _ when not Keep, Bytes > ?U32 - 64 - 16 * length(Results) ->
                    {error, too_large};
                {ok, Geometry} ->
                    case device(Buffers, Job, X) of
                        {ok, Job1} ->
                            NKeep = case Keep of true -> length(Results); false -> 0 end,
                            G = #{keep => NKeep, buffers => Buffers, shape => Shape},
                            {ok, Job1#{kernel := Kernel,
                                                args => [Arg || {Arg, _, _} <- Values],
                                                result_bytes => 0,
                                                bytes_out => case Keep of
                                                                 true -> 0;
                                                                 false -> Bytes
                                                             end,
                                                general => case Geometry of
                                                               none -> G;
                                                               _ -> G#{geometry => Geometry}
                                                           end}};
                        {error, _} = Error ->
                            Error
                    end
            end
    end.

%% An elementwise kernel's vectors all have one length, n; a raw kernel's default launch
%% covers its longest vector.
lengths(raw, Lengths) ->
    {ok, lists:max([0 | Lengths])};
lengths(elementwise, []) ->
    {ok, 0};
lengths(elementwise, [N | Rest]) ->
    case [M || M <- Rest, M =/= N] of
        [] -> {ok, N};
        [M | _] -> bad("length mismatch: the vector inputs have ~b and ~b elements", [N, M])
    end.

outputs(#{outputs := Outputs}, N) ->
    Shape = case Outputs of [_] -> single; _ -> list end,
    {[{T, N} || #{type := T} <- Outputs], Shape}.

%% {grid, G} and {block, B} as given; else blocks of B (256) covering {elements, N}, by
%% default the kernel's vectors. Without any of these options, `none': the worker covers
%% the vectors the same way, and runs nothing where they are empty.
geometry(X, Default) ->
    case geometry_options(X) of
        [_ | _] -> geometry1(X, Default);
        [] -> {ok, none}
    end.

geometry1(Job, Default) ->
    {Block, _} = maps:get(block, Job, {{?DEFAULT_BLOCK, 1, 1}, none}),
    {Shared, _} = maps:get(shared, Job, {0, none}),
    case maps:find(grid, Job) of
        {ok, {Grid, _}} ->
            {ok, {Grid, Block, Shared}};
        error ->
            {Elements, Opt} = maps:get(elements, Job, {Default, {elements, Default}}),
            {BX, BY, BZ} = Block,
            case max(1, ceil_div(Elements, BX * BY * BZ)) of
                GX when GX =< ?U32 -> {ok, {{GX, 1, 1}, Block, Shared}};
                _ -> {error, {bad_option, Opt}}
            end
    end.

ceil_div(A, B) ->
    (A + B - 1) div B.

%% @doc A job's `unranged' lists taken out of it: the job as it is submitted, and what
%% `in_range/1' checks.
-spec take_unranged(job()) -> {[{binary(), list()}], job()}.
take_unranged(#{unranged := Unranged} = Job) -> {Unranged, maps:remove(unranged, Job)};
take_unranged(Job) -> {[], Job}.

%% @doc The range check `validate/4' left for later: `{bad_args, _}' names the first
%% argument, in order, with a number beyond f32's range, as `validate/3' would have.
-spec in_range([{binary(), list()}]) -> ok | {error, erlcuda:reason()}.
in_range([]) ->
    ok;
in_range([{Name, List} | Rest]) ->
    case erlcuda_vector:in_f32_range(List) of
        true -> in_range(Rest);
        false -> bad("~s: ~ts", [Name, erlcuda_vector:f32_range_error()])
    end.

%% `N' and `Word', plural but for one.
counted(1, Word) -> "1 " ++ Word;
counted(N, Word) -> integer_to_list(N) ++ " " ++ Word ++ "s".

proper_list(L) when is_list(L) ->
    try length(L) of _ -> true catch error:badarg -> false end;
proper_list(_) ->
    false.

bad(Fmt, Args) ->
    {error, {bad_args, iolist_to_binary(io_lib:format(Fmt, Args))}}.
