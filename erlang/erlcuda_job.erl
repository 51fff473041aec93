%% @private
%% Checking a launch (kernel, arguments, options) against the kernel's spec in the
%% catalogue and packing its vectors. Runs in the caller's process.
-module(erlcuda_job).

-export([validate/3]).

-export_type([job/0]).

-type job() :: #{kernel := atom(),
                 args := [binary() | non_neg_integer()],
                 device := erlcuda:device(),
                 format := erlcuda:format(),
                 timeout := timeout(),
                 trace := boolean(),
                 result_bytes := non_neg_integer(),
                 %% launch_sync's: when a caller waiting on a busy writer gives up
                 deadline => integer() | infinity}.

%% Larger numbers would silently become infinities.
-define(F32_MAX, 3.4028234663852886e38).
%% What `receive ... after' accepts.
-define(MAX_TIMEOUT, 4294967295).

%% @doc Check a launch and pack its vectors as little-endian binaries of their element type.
-spec validate(Kernel :: term(), Args :: term(), Opts :: term()) ->
    {ok, job()} | {error, erlcuda:reason()}.
validate(Kernel, Args, Opts) ->
    case options(Opts) of
        {ok, Job} ->
            case erlcuda_catalogue:lookup(Kernel) of
                {ok, Spec} -> args(Spec, Args, Job#{kernel => Kernel});
                error -> {error, {unknown_kernel, Kernel}}
            end;
        {error, _} = Error ->
            Error
    end.

%% Options: a proper list of pairs, or a map.
options(Opts) when is_map(Opts) ->
    options(maps:to_list(Opts));
options(Opts) ->
    Default = #{device => 0, format => list, timeout => 5000, trace => false},
    case proper_list(Opts) of
        true -> lists:foldl(fun(_, {error, _} = E) -> E;
                               (Opt, {ok, Acc}) -> option(Opt, Acc)
                            end, {ok, Default}, Opts);
        false -> {error, {bad_option, Opts}}
    end.

option({device, N}, Acc) when is_integer(N), N >= 0; N =:= any -> {ok, Acc#{device := N}};
option({format, F}, Acc) when F =:= list; F =:= binary -> {ok, Acc#{format := F}};
option({timeout, T}, Acc) when is_integer(T), T >= 0, T =< ?MAX_TIMEOUT; T =:= infinity ->
    {ok, Acc#{timeout := T}};
option({trace, B}, Acc) when is_boolean(B) -> {ok, Acc#{trace := B}};
option({device, N}, _) -> {error, {bad_device, N}};
option(Opt, _) -> {error, {bad_option, Opt}}.

args(#{name := Kernel, params := Params, result := Result}, Args, Job) ->
    Arity = length(Params),
    case proper_list(Args) andalso length(Args) of
        false ->
            bad("~p expects a list of arguments", [Kernel]);
        Arity ->
            case values(Params, Args, #{}) of
                {ok, Values} -> check(Params, Result, Values, Job);
                {error, _} = Error -> Error
            end;
        N ->
            bad("~p takes ~b arguments, got ~b", [Kernel, Arity, N])
    end.

%% Each argument checked against its param, by name: `{vector, Elements, Binary}' or
%% `{dim, N}'.
values([], [], Acc) ->
    {ok, Acc};
values([#{name := Name} = P | Ps], [A | As], Acc) ->
    case value(P, A) of
        {ok, V} -> values(Ps, As, Acc#{Name => V});
        {error, _} = Error -> Error
    end.

value(#{kind := vector, name := Name, type := Type}, A) ->
    case vector(A, Name, Type) of
        {ok, Bin} -> {ok, {vector, byte_size(Bin) div elem_size(Type), Bin}};
        {error, _} = Error -> Error
    end;
value(#{kind := dim, name := Name}, A) ->
    Max = erlcuda_contract:max_elements(),
    case is_integer(A) andalso A >= 0 andalso A =< Max of
        true -> {ok, {dim, A}};
        false -> bad("~s must be an integer from 0 to ~b", [Name, Max])
    end.

%% The length rules, then the arguments in order.
check(Params, Result, Values, Job) ->
    Bad = [E || #{kind := vector, name := Name, length := [_ | _] = Length} <- Params,
                {error, _} = E <- [length_rule(Name, Length, Values)]],
    case Bad of
        [E | _] -> E;
        [] -> result(Result, Values, Job#{args => [arg(maps:get(Name, Values))
                                                   || #{name := Name} <- Params]})
    end.

length_rule(Name, Length, Values) ->
    {vector, Have, _} = maps:get(Name, Values),
    case {Have =:= product(Length, Values), Length} of
        {true, _} -> ok;
        {false, [Other]} ->
            case maps:get(Other, Values) of
                {vector, N, _} ->
                    bad("length mismatch: ~s has ~b elements, ~s has ~b", [Other, N, Name, Have]);
                {dim, N} ->
                    bad("~s has ~b elements, ~s = ~b", [Name, Have, Other, N])
            end;
        {false, _} ->
            bad("~s has ~b elements, ~s = ~b",
                [Name, Have, lists:join("*", Length), product(Length, Values)])
    end.

%% A result that no reply frame could carry is refused before any work is done.
result(#{kind := vector, type := Type, length := [_ | _] = Length}, Values, Job) ->
    Max = min(erlcuda_contract:max_elements(),
              erlcuda_protocol:max_result_bytes() div elem_size(Type)),
    case product(Length, Values) of
        N when N > Max -> {error, too_large};
        N -> {ok, Job#{result_bytes => N * elem_size(Type)}}
    end;
result(_, _, Job) ->
    {ok, Job#{result_bytes => 0}}.

product(Names, Values) ->
    lists:foldl(fun(Name, Acc) ->
                        case maps:get(Name, Values) of
                            {vector, N, _} -> Acc * N;
                            {dim, N} -> Acc * N
                        end
                end, 1, Names).

arg({vector, _, Bin}) -> Bin;
arg({dim, N}) -> N.

elem_size(f32) -> 4.

vector(Bin, Name, Type) when is_binary(Bin) ->
    Size = elem_size(Type),
    Max = erlcuda_contract:max_elements(),
    case byte_size(Bin) rem Size of
        0 when byte_size(Bin) div Size > Max -> {error, too_large};
        0 -> {ok, Bin};
        _ -> bad("~s: binary of ~b bytes is not a multiple of ~b", [Name, byte_size(Bin), Size])
    end;
vector(List, Name, f32) when is_list(List) ->
    try << <<(f32(X)):32/float-little>> || X <- List >> of
        Bin -> vector(Bin, Name, f32)
    catch
        throw:{not_a_number, X} -> bad("~s: not a number: ~0P", [Name, X, 8]);
        error:badarg -> bad("~s: a number outside the f32 range", [Name]);
        error:_ -> bad("~s: not a proper list", [Name])
    end;
vector(Other, Name, Type) ->
    bad("~s: expected a list of numbers or a ~p binary, got ~0P", [Name, Type, Other, 8]).

f32(X) when is_number(X), X =< ?F32_MAX, X >= -?F32_MAX -> X;
f32(X) when is_number(X) -> error(badarg);
f32(X) -> throw({not_a_number, X}).

proper_list(L) when is_list(L) ->
    try length(L) of _ -> true catch error:badarg -> false end;
proper_list(_) ->
    false.

bad(Fmt, Args) ->
    {error, {bad_args, iolist_to_binary(io_lib:format(Fmt, Args))}}.
