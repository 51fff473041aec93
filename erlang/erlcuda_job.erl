%% @private
%% Checking a job's kernel, arguments and options, and encoding it as a launch frame.
%% Runs in the caller's process: nothing here goes through a shared server.
-module(erlcuda_job).

-export([validate/3, encode_launch/6]).

-export_type([job/0]).

-type job() :: #{kernel := erlcuda:kernel(),
                 args := [binary() | non_neg_integer()],
                 device := erlcuda:device(),
                 format := erlcuda:format(),
                 timeout := timeout(),
                 trace := boolean()}.

-define(KERNELS, [vector_add, reduce, dot_product, matmul]).
%% One operand at most 2^31 - 1 elements: the device kernels index with 64-bit counters,
%% but a larger request cannot be answered through one port frame anyway.
-define(MAX_ELEMENTS, 2147483647).
%% Larger numbers would silently become infinities.
-define(F32_MAX, 3.4028234663852886e38).

%% @doc Check a launch and pack its vectors as little-endian f32 binaries.
-spec validate(Kernel :: term(), Args :: term(), Opts :: term()) ->
    {ok, job()} | {error, erlcuda:reason()}.
validate(Kernel, Args, Opts) ->
    maybe_all([fun() -> options(Opts) end,
               fun(O) -> kernel(Kernel, O) end,
               fun(O) -> args(Kernel, Args, O) end]).

maybe_all(Steps) ->
    lists:foldl(fun(_, {error, _} = E) -> E;
                   (Step, {ok, Acc}) -> Step(Acc);
                   (Step, start) -> Step()
                end, start, Steps).

options(Opts) when is_list(Opts) ->
    Default = #{device => 0, format => list, timeout => 5000, trace => false},
    lists:foldl(fun(_, {error, _} = E) -> E;
                   (Opt, {ok, Acc}) -> option(Opt, Acc)
                end, {ok, Default}, Opts);
options(Opts) ->
    {error, {bad_option, Opts}}.

option({device, N}, Acc) when is_integer(N), N >= 0; N =:= any -> {ok, Acc#{device := N}};
option({format, F}, Acc) when F =:= list; F =:= binary -> {ok, Acc#{format := F}};
option({timeout, T}, Acc) when is_integer(T), T >= 0; T =:= infinity -> {ok, Acc#{timeout := T}};
option({trace, B}, Acc) when is_boolean(B) -> {ok, Acc#{trace := B}};
option({device, N}, _) -> {error, {bad_device, N}};
option(Opt, _) -> {error, {bad_option, Opt}}.

kernel(K, Opts) ->
    case lists:member(K, ?KERNELS) of
        true -> {ok, Opts#{kernel => K}};
        false -> {error, {unknown_kernel, K}}
    end.

args(Kernel, Args, _) when not is_list(Args) ->
    {error, {bad_args, iolist_to_binary(io_lib:format("~p expects a list of arguments",
                                                      [Kernel]))}};
args(Kernel, Args, Opts) ->
    Arity = arity(Kernel),
    case length(Args) of
        Arity -> typed(Kernel, Args, Opts);
        N -> bad("~p takes ~b arguments, got ~b", [Kernel, Arity, N])
    end.

arity(reduce) -> 1;
arity(matmul) -> 5;
arity(_) -> 2.

typed(reduce, [A], Opts) ->
    with_vectors([A], fun([VA]) -> {ok, Opts#{args => [VA]}} end);
typed(matmul, [A, B, M, N, K], Opts) ->
    with_vectors([A, B], fun([VA, VB]) -> matmul(VA, VB, M, N, K, Opts) end);
typed(_, [A, B], Opts) ->
    with_vectors([A, B], fun([VA, VB]) when byte_size(VA) =:= byte_size(VB) ->
                                 {ok, Opts#{args => [VA, VB]}};
                            ([VA, VB]) ->
                                 bad("length mismatch: ~b and ~b",
                                     [byte_size(VA) div 4, byte_size(VB) div 4])
                         end).

matmul(VA, VB, M, N, K, Opts) ->
    case [D || {D, V} <- [{"M", M}, {"N", N}, {"K", K}],
               not (is_integer(V) andalso V >= 0 andalso V =< ?MAX_ELEMENTS)] of
        [Dim | _] ->
            bad("~s must be an integer from 0 to ~b", [Dim, ?MAX_ELEMENTS]);
        [] when M * K =/= byte_size(VA) div 4 ->
            bad("A has ~b elements, M*K = ~b", [byte_size(VA) div 4, M * K]);
        [] when K * N =/= byte_size(VB) div 4 ->
            bad("B has ~b elements, K*N = ~b", [byte_size(VB) div 4, K * N]);
        [] when M * N > ?MAX_ELEMENTS ->
            bad("the result M*N = ~b is too large", [M * N]);
        [] ->
            {ok, Opts#{args => [VA, VB, M, N, K]}}
    end.

with_vectors(Args, Then) ->
    Names = lists:sublist(["A", "B"], length(Args)),
    Packed = [vector(A, Name) || {A, Name} <- lists:zip(Args, Names)],
    case [E || {error, _} = E <- Packed] of
        [E | _] -> E;
        [] -> Then([V || {ok, V} <- Packed])
    end.

vector(Bin, Name) when is_binary(Bin) ->
    case byte_size(Bin) rem 4 of
        0 when byte_size(Bin) div 4 > ?MAX_ELEMENTS -> {error, too_large};
        0 -> {ok, Bin};
        _ -> bad("~s: binary of ~b bytes is not a multiple of 4", [Name, byte_size(Bin)])
    end;
vector(List, Name) when is_list(List) ->
    try << <<(f32(X)):32/float-little>> || X <- List >> of
        Bin -> {ok, Bin}
    catch
        throw:{not_a_number, X} -> bad("~s: not a number: ~0P", [Name, X, 8]);
        error:badarg -> bad("~s: a number outside the f32 range", [Name]);
        error:_ -> bad("~s: not a proper list", [Name])
    end;
vector(Other, Name) ->
    bad("~s: expected a list of numbers or an f32 binary, got ~0P", [Name, Other, 8]).

f32(X) when is_number(X), X =< ?F32_MAX, X >= -?F32_MAX -> X;
f32(X) when is_number(X) -> error(badarg);
f32(X) -> throw({not_a_number, X}).

bad(Fmt, Args) ->
    {error, {bad_args, iolist_to_binary(io_lib:format(Fmt, Args))}}.

%% @doc The launch as an erlport message frame, `{'M', {launch, ...}}', built as an iolist:
%% the vectors go into the port's writev as they are, never copied into one big binary.
-spec encode_launch(JobId :: pos_integer(), ReplyTo :: pid() | reference(),
                    Device :: non_neg_integer(), Kernel :: erlcuda:kernel(),
                    Args :: [binary() | non_neg_integer()], Opts :: map()) -> iolist().
encode_launch(JobId, ReplyTo, Device, Kernel, Args, Opts) ->
    [<<131, 104, 2, 119, 1, $M, 104, 7, 119, 6, "launch">>,
     ext(JobId), ext(ReplyTo), ext(Device), ext(Kernel),
     <<108, (length(Args)):32>>, [arg(A) || A <- Args], <<106>>,
     ext(Opts)].

arg(Bin) when is_binary(Bin) -> [<<109, (byte_size(Bin)):32>>, Bin];
arg(Int) -> ext(Int).

ext(Term) ->
    <<131, Body/binary>> = term_to_binary(Term),
    Body.
