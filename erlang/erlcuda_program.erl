%% @private
%% A program's definition, checked once and written once as the bytes every run sends.
%%
%% A program is a list of steps, each a kernel (a built-in one of `?STEP_BUILTINS', or a
%% kernel loaded with `load' or `elementwise') on arguments that name the program's inputs,
%% earlier steps' results, buffers or numbers, and the outputs a run answers. What can be
%% known without the inputs is checked here (names, order, arity, each argument's kind for
%% its param, the outputs); the element types and lengths follow from the inputs and are
%% checked by the worker at each run, before anything runs. A run is a launch of the
%% program (erlcuda_job), so it goes wherever a launch goes.
%%
%% The definition travels as the ETF of
%% `{erlcuda_program, 1, NInputs, [{KernelName, [Arg]}], [{step, J, K}], Options}', an
%% argument `{in, I}' or `{step, J, K}' (indexes from 0) or a number; buffers named in steps
%% are passed as inputs after the caller's own.
-module(erlcuda_program).

-export([new/2, is_program/1, name/1, definition/1, inputs/1, baked/1, shape/1,
         outputs/1]).

-export_type([program/0, spec/0, use/0]).

-define(STEP_BUILTINS, [vector_add, reduce, dot_product, matmul]).
-define(MAX_INPUTS, 255).
-define(MAX_STEPS, 65536).
-define(VERSION, 1).

%% A program made by `erlcuda:program/1,2'.
-opaque program() :: {erlcuda_program, #{name := atom(), def := binary(),
                                         inputs := [{atom(), use()}],
                                         baked := [{term(), erlcuda:element_type()}],
                                         shape := single | list,
                                         outputs := [vector | scalar],
                                         sum := non_neg_integer()}}.
-type spec() :: #{inputs := [atom() | {atom(), erlcuda:element_type()}],
                  steps := [{atom(), atom(), [term()]}],
                  outputs := term(), name => atom()}.
%% What a run passes for an input: a vector (of a type, where the program fixes it), a
%% dim (a non-negative integer) or a scalar of a type.
-type use() :: vector | {vector, erlcuda:element_type()} | dim
             | {scalar, erlcuda:element_type()}.

%% @doc The program of `Spec', checked; options `{fuse, boolean()}' and `{graph,
%% boolean()}' (both `true' by default).
-spec new(term(), term()) -> {ok, program()} | {error, {bad_program, binary()}}.
new(Spec, Opts) ->
    try
        Flags = options(Opts),
        #{inputs := Inputs, steps := Steps, outputs := Outputs} = Fields = fields(Spec),
        Names = declared(Inputs),
        State = lists:foldl(fun step/2, start(Names), number(Steps)),
        {Refs, Shape} = outputs_of(Outputs, State),
        {ok, make(maps:get(name, Fields, program), Names, State, Refs, Shape, Flags)}
    catch
        throw:{bad_program, Text} -> {error, {bad_program, iolist_to_binary(Text)}}
    end.

%% @doc Whether `Term' is a program.
-spec is_program(term()) -> boolean().
is_program(Term) ->
    %% A term altered since it was made fails here: its fields no longer agree with the
    %% sum made of them (a run whose outputs the definition does not make would have its
    %% worker killed, every caller's jobs with it), or (improper lists too) they are not
    %% what a program holds, which would fail later as an exception in the caller.
    try well_formed(Term)
    catch error:_ -> false
    end.

well_formed({erlcuda_program, #{sum := Sum} = Program}) ->
    Fields = maps:remove(sum, Program),
    erlang:phash2(Fields) =:= Sum andalso fields_well_formed(Fields);
well_formed(_) ->
    false.

fields_well_formed(#{name := Name, def := Def, inputs := Inputs, baked := Baked,
                     shape := Shape, outputs := Outputs})
  when is_atom(Name), is_binary(Def), (Shape =:= single orelse Shape =:= list) ->
    lists:all(fun({I, Use}) -> is_atom(I) andalso is_use(Use); (_) -> false end, Inputs)
        andalso lists:all(fun({_, T}) -> erlcuda_vector:is_type(T); (_) -> false end, Baked)
        andalso lists:all(fun(O) -> O =:= vector orelse O =:= scalar end, Outputs);
fields_well_formed(_) ->
    false.

is_use(vector) -> true;
is_use(dim) -> true;
is_use({vector, T}) -> erlcuda_vector:is_type(T);
is_use({scalar, T}) -> erlcuda_vector:is_type(T);
is_use(_) -> false.

-spec name(program()) -> atom().
name({erlcuda_program, #{name := Name}}) -> Name.

%% @doc The definition's bytes, as the launch frame carries them.
-spec definition(program()) -> binary().
definition({erlcuda_program, #{def := Def}}) -> Def.

%% @doc The caller's inputs, in order, with what each takes.
-spec inputs(program()) -> [{atom(), use()}].
inputs({erlcuda_program, #{inputs := Inputs}}) -> Inputs.

%% @doc The buffers the steps name, with their element types, passed after the caller's
%% inputs.
-spec baked(program()) -> [{term(), erlcuda:element_type()}].
baked({erlcuda_program, #{baked := Baked}}) -> Baked.

%% @doc `single' where the program answers its one output as it is, `list' where a list.
-spec shape(program()) -> single | list.
shape({erlcuda_program, #{shape := Shape}}) -> Shape.

%% @doc Each output's kind, in order.
-spec outputs(program()) -> [vector | scalar].
outputs({erlcuda_program, #{outputs := Outputs}}) -> Outputs.

%% The spec's fields.

options(Opts) when is_map(Opts) -> options(maps:to_list(Opts));
options(Opts) when is_list(Opts) ->
    lists:foldl(fun({K, V}, Acc) when (K =:= fuse orelse K =:= graph), is_boolean(V) ->
                        Acc#{K => V};
                   (Opt, _) ->
                        bad("~0P is not a program option ({fuse, boolean()}, "
                            "{graph, boolean()})", [Opt, 8])
                end, #{fuse => true, graph => true}, proper(Opts, "the options"));
options(Opts) ->
    bad("the options must be a list or a map, not ~0P", [Opts, 8]).

fields(Spec) when is_map(Spec) ->
    case maps:keys(maps:without([inputs, steps, outputs, name], Spec)) of
        [] -> ok;
        [K | _] -> bad("~0P is not a field of a program (inputs, steps, outputs, name)",
                       [K, 8])
    end,
    [bad("a program needs ~s", [K]) || K <- [inputs, steps, outputs], not is_map_key(K, Spec)],
    case maps:get(name, Spec, program) of
        Name when is_atom(Name) -> Spec;
        Other -> bad("the name must be an atom, not ~0P", [Other, 8])
    end;
fields(Spec) ->
    bad("a program is a map of inputs, steps and outputs, not ~0P", [Spec, 8]).

declared(Inputs) ->
    List = proper(Inputs, "the inputs"),
    length(List) =< ?MAX_INPUTS orelse bad("~b inputs: ~b at most",
                                           [length(List), ?MAX_INPUTS]),
    Named = [input(I) || I <- List],
    unique([N || {N, _} <- Named]),
    Named.

input({Name, Type}) when is_atom(Name) ->
    erlcuda_vector:is_type(Type) orelse bad("input ~p: ~0P is not an element type (~w)",
                                            [Name, Type, 8, erlcuda_vector:types()]),
    {Name, Type};
input(Name) when is_atom(Name) -> {Name, any};
input(Other) -> bad("an input is a name or {Name, Type}, not ~0P", [Other, 8]).

number(Steps) ->
    List = proper(Steps, "the steps"),
    List =/= [] orelse bad("a program needs a step", []),
    length(List) =< ?MAX_STEPS orelse bad("~b steps: ~b at most", [length(List), ?MAX_STEPS]),
    lists:zip(lists:seq(0, length(List) - 1), List).

%% The steps, in order: what each name means, how each input is used, the baked buffers.

start(Inputs) ->
    Uses = maps:from_list([{N, {T, unused}} || {N, T} <- Inputs]),
    Index = maps:from_list(lists:zip([N || {N, _} <- Inputs], lists:seq(0, length(Inputs) - 1))),
    #{inputs => length(Inputs), uses => Uses, index => Index, steps => #{}, later => #{},
      baked => [], wire => []}.

step({J, {Name, Kernel, Args}}, State) when is_atom(Name), is_atom(Kernel) ->
    Where = io_lib:format("step ~b (~p)", [J + 1, Name]),
    taken(Name, State) andalso bad("~s: the name ~p is taken", [Where, Name]),
    Params = params(Kernel, Where),
    List = proper(Args, [Where, "'s arguments"]),
    length(List) =:= length(Params)
        orelse bad("~s: ~p takes ~b argument~s, got ~b",
                   [Where, Kernel, length(Params), [$s || length(Params) =/= 1], length(List)]),
    {Wire, State1} = args(lists:zip(Params, List), Where, State, []),
    Results = results(Kernel, Params, Where),
    #{steps := Steps, wire := Done} = State1,
    State1#{steps := Steps#{Name => {J, Results}},
            wire := [{atom_to_binary(Kernel, utf8), Wire} | Done]};
step({J, Other}, _) ->
    bad("step ~b: a step is {Name, Kernel, Args} (atoms and a list), not ~0P",
        [J + 1, Other, 8]).

taken(Name, #{index := Index, steps := Steps}) ->
    is_map_key(Name, Index) orelse is_map_key(Name, Steps).

%% Each param: `{vector, Access}', `dim' or `{scalar, Type}'.
params(Kernel, Where) ->
    case erlcuda_catalogue:lookup(Kernel) of
        {ok, #{user := elementwise, params := Ps}} -> [param(P) || P <- Ps];
        {ok, #{user := raw, params := Ps}} -> [param(P) || P <- Ps];
        {ok, #{params := Ps}} ->
            lists:member(Kernel, ?STEP_BUILTINS)
                orelse bad("~s: ~p is not a program step (~w, or a loaded kernel)",
                           [Where, Kernel, ?STEP_BUILTINS]),
            [param(P) || P <- Ps];
        error ->
            bad("~s: no kernel ~p (a built-in one, or one loaded with load/elementwise)",
                [Where, Kernel])
    end.

param(#{kind := vector} = P) -> {vector, maps:get(access, P, in)};
param(#{kind := dim}) -> dim;
param(#{kind := scalar, type := T}) -> {scalar, T}.

results(Kernel, Params, Where) ->
    case erlcuda_catalogue:lookup(Kernel) of
        {ok, #{user := elementwise, outputs := Outs}} -> [vector || _ <- Outs];
        {ok, #{user := raw}} ->
            case [vector || {vector, A} <- Params, A =/= in] of
                [] -> bad("~s: ~p writes no vector, so it has no result", [Where, Kernel]);
                Written -> Written
            end;
        {ok, #{result := #{kind := scalar}}} -> [scalar];
        {ok, _} -> [vector]
    end.

args([], _, State, Acc) ->
    {lists:reverse(Acc), State};
args([{Param, Arg} | Rest], Where, State, Acc) ->
    N = length(Acc) + 1,
    {Wire, State1} = arg(Param, Arg, io_lib:format("~s, argument ~b", [Where, N]), State),
    args(Rest, Where, State1, [Wire | Acc]).

arg(Param, Name, Where, #{index := Index} = State) when is_atom(Name), is_map_key(Name, Index) ->
    {{in, maps:get(Name, Index)}, use(Name, Param, Where, State)};
arg(Param, Name, Where, State) when is_atom(Name) ->
    step_ref(Param, {Name, 1}, Where, State);
arg(Param, {Name, K} = Ref, Where, State) when is_atom(Name), is_integer(K) ->
    step_ref(Param, Ref, Where, State);
arg(Param, N, Where, State) when is_number(N) ->
    {constant(Param, N, Where), State};
arg(Param, B, Where, State) ->
    case erlcuda_buffers:is_buffer(B) of
        true -> baked(Param, B, Where, State);
        false -> bad("~s: ~0P is no input, step, number or buffer", [Where, B, 8])
    end.

step_ref(Param, {Name, K}, Where, #{steps := Steps} = State) ->
    case maps:find(Name, Steps) of
        {ok, {J, Results}} when K >= 1, K =< length(Results) ->
            case {lists:nth(K, Results), Param} of
                {scalar, _} ->
                    bad("~s: ~p is a scalar, an output only (not an argument)", [Where, Name]);
                {vector, {vector, out}} ->
                    bad("~s is an out param: a count in a program (its values are never "
                        "written)", [Where]);
                {vector, {vector, _}} ->
                    {{step, J, K - 1}, State};
                {vector, _} ->
                    bad("~s: ~p is a vector where a number is taken", [Where, Name])
            end;
        {ok, {_, Results}} ->
            bad("~s: step ~p makes ~b results, not ~p", [Where, Name, length(Results), K]);
        error ->
            bad("~s: ~p is no input or earlier step (a step names inputs and the steps "
                "before it)", [Where, Name])
    end.

%% An input's use, the same wherever it is passed.
use(Name, Param, Where, #{uses := Uses} = State) ->
    {Declared, Seen} = maps:get(Name, Uses),
    Use = case {Param, Declared} of
              {{vector, out}, _} -> bad("~s is an out param: a count in a program", [Where]);
              {{vector, _}, any} -> vector;
              {{vector, _}, T} -> {vector, T};
              {dim, any} -> dim;
              {{scalar, T}, any} -> {scalar, T};
              _ -> bad("~s: input ~p is of type ~p, where a number is taken",
                       [Where, Name, Declared])
          end,
    case Seen of
        unused -> State#{uses := Uses#{Name => {Declared, Use}}};
        Use -> State;
        Other -> bad("~s: input ~p is a ~s here but a ~s before", [Where, Name,
                                                                   use_name(Use),
                                                                   use_name(Other)])
    end.

use_name({vector, T}) -> io_lib:format("~p vector", [T]);
use_name({scalar, T}) -> io_lib:format("~p scalar", [T]);
use_name(U) -> atom_to_list(U).

constant({vector, in}, N, Where) ->
    bad("~s: ~p where a vector is taken", [Where, N]);
constant({vector, _}, N, _) when is_integer(N), N >= 0 ->
    N;
constant({vector, _}, N, Where) ->
    bad("~s: ~p is no count (a non-negative integer)", [Where, N]);
constant(dim, N, _) when is_integer(N), N >= 0 ->
    N;
constant(dim, N, Where) ->
    bad("~s: ~p is no dim (a non-negative integer)", [Where, N]);
constant({scalar, T}, N, Where) ->
    case erlcuda_vector:scalar(T, N) of
        {ok, _} -> N;
        {error, Why} -> bad("~s: ~ts", [Where, Why])
    end.

%% A buffer named in a step: an input of its own, after the caller's.
baked({vector, in}, B, _, #{baked := Baked, inputs := N} = State) ->
    I = N + length(Baked),
    case lists:search(fun({_, Held}) -> Held =:= B end, Baked) of
        {value, {At, _}} -> {{in, At}, State};
        false -> {{in, I}, State#{baked := Baked ++ [{I, B}]}}
    end;
baked(_, _, Where, _) ->
    bad("~s: a buffer goes to an in param (a program never writes its inputs)", [Where]).

outputs_of(Name, State) when is_atom(Name) -> {[output(Name, State)], single};
outputs_of({Name, K} = Ref, State) when is_atom(Name), is_integer(K) ->
    {[output(Ref, State)], single};
outputs_of(List, State) ->
    Outputs = proper(List, "the outputs"),
    Outputs =/= [] orelse bad("a program needs an output", []),
    {[output(O, State) || O <- Outputs], list}.

output(Name, State) when is_atom(Name) -> output({Name, 1}, State);
output({Name, K}, #{steps := Steps, index := Index}) when is_atom(Name), is_integer(K) ->
    case maps:find(Name, Steps) of
        {ok, {J, Results}} when K >= 1, K =< length(Results) ->
            {{step, J, K - 1}, lists:nth(K, Results)};
        {ok, {_, Results}} ->
            bad("output ~p: step ~p makes ~b results", [{Name, K}, Name, length(Results)]);
        error when is_map_key(Name, Index) ->
            bad("output ~p is an input: an output is a step's result", [Name]);
        error ->
            bad("output ~p names no step", [Name])
    end;
output(Other, _) ->
    bad("an output is a step's name or {Step, N}, not ~0P", [Other, 8]).

make(Name, Inputs, #{uses := Uses, baked := Baked, wire := Wire} = State, Refs, Shape, Flags) ->
    case [N || {N, _} <- Inputs, element(2, maps:get(N, Uses)) =:= unused] of
        [Unused | _] -> bad("input ~p is never used", [Unused]);
        [] -> ok
    end,
    Options = [K || {K, true} <- lists:sort(maps:to_list(Flags))],
    Def = term_to_binary({erlcuda_program, ?VERSION, maps:get(inputs, State) + length(Baked),
                          lists:reverse(Wire), [R || {R, _} <- Refs], Options}),
    Program = #{name => Name, def => Def,
                inputs => [{N, element(2, maps:get(N, Uses))} || {N, _} <- Inputs],
                baked => [{B, element(6, B)} || {_, B} <- Baked], shape => Shape,
                outputs => [Kind || {_, Kind} <- Refs]},
    {erlcuda_program, Program#{sum => erlang:phash2(Program)}}.

unique(Names) ->
    case Names -- lists:usort(Names) of
        [] -> ok;
        [Twice | _] -> bad("the name ~p is given twice", [Twice])
    end.

proper(L, What) when is_list(L) ->
    try length(L) of _ -> L
    catch error:badarg -> bad("~s must be a proper list", [What])
    end;
proper(Other, What) ->
    bad("~s must be a list, not ~0P", [What, Other, 8]).

-spec bad(io:format(), [term()]) -> no_return().
bad(Fmt, Args) ->
    throw({bad_program, io_lib:format(Fmt, Args)}).
