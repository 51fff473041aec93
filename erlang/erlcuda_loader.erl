%% @private
%% User modules into the worker: `erlcuda:load/4' and `erlcuda:elementwise/5' are checked
%% here (their declarations), then loaded by this module's server, one change at a time:
%% into the worker first, and into the catalogue (erlcuda_catalogue) once the worker has it.
-module(erlcuda_loader).
-behaviour(gen_server).

-export([start_link/0, declare/4, declare_elementwise/5, load/2, unload/1]).

%% gen_server.
-export([init/1, handle_call/3, handle_cast/2]).

%% How long an unload waits for the worker, which then forgets the module on its own time.
-define(UNLOAD_TIMEOUT, 10000).
%% A load's default: nvcc takes seconds, more for a large source on a busy machine.
-define(LOAD_TIMEOUT, 120000).
-define(MAX_TIMEOUT, 4294967295).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    gen_server:start_link({local, ?MODULE}, ?MODULE, [], []).

%% @doc A raw module's declaration, checked: `Kernels' is `[{Name, Params}]', each param
%% `{in | out | inout, Type}' or `{scalar, Type}'. Returns the declaration and the timeout
%% of its load.
-spec declare(term(), term(), term(), term()) ->
    {ok, erlcuda_catalogue:declaration(), timeout()} | {error, erlcuda:reason()}.
declare(Module, Source, Kernels, Opts) ->
    steps([fun() -> module_name(Module) end,
           fun() -> text(Source, "the source") end,
           fun() -> load_options(Opts) end,
           fun() -> raw_kernels(Kernels) end],
          fun([_, Src, {Flags, Timeout}, Decls]) ->
                  Specs = maps:from_list(
                            [{Name, raw_spec(Module, Name, Params)} || {Name, Params} <- Decls]),
                  Wire = [{atom_to_binary(Name, utf8),
                           [{Access, Type} || {Access, Type} <- Params]}
                          || {Name, Params} <- Decls],
                  {ok, #{module => Module,
                         call => {load, [atom_to_binary(Module, utf8), Src, Flags, Wire]},
                         specs => Specs}, Timeout}
          end).

%% @doc An elementwise kernel's declaration, checked: `Inputs' `[{Var, Type} | {Var,
%% {scalar, Type}}]', `Outputs' `[{Var, Type}]', `Operation' a C statement over them.
-spec declare_elementwise(term(), term(), term(), term(), term()) ->
    {ok, erlcuda_catalogue:declaration(), timeout()} | {error, erlcuda:reason()}.
declare_elementwise(Name, Inputs, Outputs, Operation, Opts) ->
    steps([fun() -> identifier(Name, "the kernel's name") end,
           fun() -> variables(Name, Inputs, Outputs) end,
           fun() -> text(Operation, "the operation") end,
           fun() -> load_options(Opts) end],
          fun([_, {Ins, Outs}, Op, {Flags, Timeout}]) ->
                  Spec = elementwise_spec(Name, Ins, Outs),
                  Wire = [{atom_to_binary(V, utf8), T, K} || {V, T, K} <- Ins],
                  WireOuts = [{atom_to_binary(V, utf8), T} || {V, T} <- Outs],
                  {ok, #{module => Name,
                         call => {elementwise, [atom_to_binary(Name, utf8), Wire, WireOuts, Op,
                                                Flags]},
                         specs => #{Name => Spec}}, Timeout}
          end).

%% @doc Load a declared module into the worker and, once it is loaded, into the catalogue
%% (replacing a module of the same name). At most `Timeout' for the worker's answer. The
%% compile's event runs in the calling process (erlcuda_telemetry).
-spec load(erlcuda_catalogue:declaration(), timeout()) -> ok | {error, erlcuda:reason()}.
load(#{module := Module} = Declaration, Timeout) ->
    case call({load, Declaration, Timeout}) of
        {Answer, Compile} when is_map(Compile); Compile =:= none ->
            ok = erlcuda_telemetry:compile(Module, {Answer, Compile}),
            Answer;
        {error, _} = Error ->
            Error
    end.

%% @doc Drop a module: its kernels leave the catalogue at once, and the worker forgets it.
-spec unload(term()) -> ok | {error, erlcuda:reason()}.
unload(Module) when is_atom(Module) ->
    call({unload, Module});
unload(Module) ->
    bad("unload: ~0P is not a module name", [Module, 8]).

call(Request) ->
    try gen_server:call(?MODULE, Request, infinity)
    catch exit:{noproc, _} -> {error, {worker_down, not_running}}
    end.

%% gen_server: one change at a time.

-spec init([]) -> {ok, #{}}.
init([]) ->
    %% A load that was in flight when a predecessor died did not finish.
    ok = erlcuda_catalogue:pending(none),
    {ok, #{}}.

-spec handle_call(term(), gen_server:from(), map()) -> {reply, term(), map()}.
handle_call({load, #{module := Module, specs := Specs, call := {Fun, Args}} = D, Timeout},
            _From, State) ->
    case erlcuda_catalogue:conflict(Module, maps:keys(Specs)) of
        {error, _} = Error ->
            {reply, {Error, none}, State};
        ok ->
            ok = erlcuda_catalogue:pending(D),
            {Answer, Compile} = compiled(worker_call(Fun, Args, Timeout)),
            ok = erlcuda_catalogue:pending(none),
            case Answer of
                ok -> erlcuda_catalogue:commit(D);
                _ -> ok
            end,
            {reply, {Answer, Compile}, State}
    end;
handle_call({unload, Module}, _From, State) ->
    _ = erlcuda_catalogue:drop(Module)
        andalso worker_call(unload, [atom_to_binary(Module, utf8)], ?UNLOAD_TIMEOUT),
    {reply, ok, State};
handle_call(_, _, State) ->
    {reply, {error, unknown_call}, State}.

-spec handle_cast(term(), map()) -> {noreply, map()}.
handle_cast(_, State) ->
    {noreply, State}.

%% A load's answer, and what the worker says of its compile (`none' before it ran): `{ok,
%% Compile}' or `{error, Reason, Compile}'.
compiled({ok, #{<<"duration_ns">> := Ns, <<"cache_hit">> := Hit}})
  when is_integer(Ns), is_boolean(Hit) ->
    {ok, #{duration_ns => Ns, cache_hit => Hit}};
compiled({error, Reason, #{<<"duration_ns">> := Ns, <<"cache_hit">> := Hit}})
  when is_integer(Ns), is_boolean(Hit) ->
    {{error, Reason}, #{duration_ns => Ns, cache_hit => Hit}};
compiled({error, _} = Error) ->
    {Error, none};
compiled(Other) ->
    {internal("an unexpected answer: ~0P", [Other, 20]), none}.

%% The worker's answer: `ok', or the reason it gives (a load's with its compile's report).
worker_call(Fun, Args, Timeout) ->
    try erlcuda_worker:call(Fun, Args, Timeout) of
        {ok, ok} -> ok;
        {ok, {error, _} = Error} -> Error;
        {ok, {ok, #{} = Compile}} -> {ok, Compile};
        {ok, {error, _, #{}} = Error} -> Error;
        {ok, Other} -> internal("an unexpected answer: ~0P", [Other, 20]);
        {error, {worker_down, _}} = Error -> Error;
        {error, port_busy} -> {error, overloaded};
        {error, Text} when is_binary(Text) -> {error, {internal, Text}};
        {error, Other} -> internal("~0P", [Other, 20])
    catch
        exit:{timeout, _} -> {error, timeout};
        exit:{noproc, _} -> {error, {worker_down, not_running}}
    end.

internal(Fmt, Args) ->
    {error, {internal, iolist_to_binary(io_lib:format(Fmt, Args))}}.

%% Declarations.

raw_spec(Module, Name, Params) ->
    Ps = [param(P, iolist_to_binary(["arg", integer_to_list(I)]))
          || {I, P} <- lists:zip(lists:seq(1, length(Params)), Params)],
    #{name => Name,
      doc => iolist_to_binary(io_lib:format("a kernel of module ~p", [Module])),
      params => Ps,
      result => #{kind => vector, length => []},
      types => types([T || {_, T} <- Params]),
      general => true, user => raw, module => Module}.

param({scalar, Type}, Name) -> #{name => Name, kind => scalar, type => Type, length => []};
param({Access, Type}, Name) ->
    #{name => Name, kind => vector, type => Type, length => [], access => Access}.

elementwise_spec(Name, Ins, Outs) ->
    First = case [V || {V, _, vector} <- Ins] of
                [V | _] -> [atom_to_binary(V, utf8)];
                [] -> []
            end,
    Params = [case Kind of
                  vector -> #{name => atom_to_binary(V, utf8), kind => vector, type => T,
                              length => First -- [atom_to_binary(V, utf8)], access => in};
                  scalar -> #{name => atom_to_binary(V, utf8), kind => scalar, type => T,
                              length => []}
              end || {V, T, Kind} <- Ins],
    Outputs = [#{name => atom_to_binary(V, utf8), kind => vector, type => T, length => First,
                 access => out} || {V, T} <- Outs],
    #{name => Name,
      doc => iolist_to_binary(io_lib:format("an elementwise kernel (~b in, ~b out)",
                                            [length(Ins), length(Outs)])),
      params => Params,
      result => hd([maps:without([name, access], O) || O <- Outputs]),
      outputs => Outputs,
      types => types([T || {_, T, _} <- Ins] ++ [T || {_, T} <- Outs]),
      general => true, user => elementwise, module => Name}.

types([]) -> [f32];
types(Ts) -> lists:usort(Ts).

%% Each step returns {ok, Value} or an error; the values go to Done, in order.
steps(Steps, Done) ->
    steps(Steps, Done, []).

steps([], Done, Acc) ->
    Done(lists:reverse(Acc));
steps([Step | Rest], Done, Acc) ->
    case Step() of
        {ok, V} -> steps(Rest, Done, [V | Acc]);
        {error, _} = Error -> Error
    end.

module_name(M) when is_atom(M) ->
    case byte_size(atom_to_binary(M, utf8)) of
        N when N > 0, N =< 255 -> {ok, M};
        _ -> bad("~0p: a module name of 1 to 255 bytes", [M])
    end;
module_name(M) ->
    bad("~0P is not a module name (an atom)", [M, 8]).

%% A C identifier, which names a function or a variable in the source erlcuda writes. A
%% kernel's name travels in a launch frame, which gives its length one byte; the worker holds
%% a variable's name to the same length.
identifier(A, What) when is_atom(A) ->
    Bin = atom_to_binary(A, utf8),
    case byte_size(Bin) =< erlcuda_contract:kernel_name_bytes()
         andalso re:run(Bin, "^[A-Za-z_][A-Za-z0-9_]*$", [{capture, none}]) =:= match of
        true -> {ok, A};
        false -> bad("~s: ~0p is not a C identifier", [What, A])
    end;
identifier(A, What) ->
    bad("~s: ~0P is not an atom", [What, A, 8]).

text(Data, What) ->
    try iolist_to_binary(Data) of
        <<>> -> bad("~s is empty", [What]);
        Bin -> {ok, Bin}
    catch
        error:badarg -> bad("~s must be iodata (a binary or a string)", [What])
    end.

%% Every list a caller gives is checked to be proper before it is walked: `length/1' in a
%% guard fails the guard for an improper list, where a generator or a fold would raise.
load_options(Opts) when is_map(Opts) ->
    load_options(maps:to_list(Opts));
load_options(Opts) when is_list(Opts), length(Opts) >= 0 ->
    load_options(Opts, {[], ?LOAD_TIMEOUT});
load_options(Opts) ->
    {error, {bad_option, Opts}}.

load_options([], Acc) ->
    {ok, Acc};
load_options([{options, Flags} = Opt | Rest], {_, T}) ->
    case flags(Flags) of
        {ok, Bins} -> load_options(Rest, {Bins, T});
        error -> {error, {bad_option, Opt}}
    end;
load_options([{timeout, T} | Rest], {F, _})
  when is_integer(T), T > 0, T =< ?MAX_TIMEOUT; T =:= infinity ->
    load_options(Rest, {F, T});
load_options([Opt | _], _) ->
    {error, {bad_option, Opt}}.

%% nvcc's flags: each iodata, sent as a binary. Which flags nvcc may get is the worker's to
%% say (its allow-list), so that the list is written once.
flags(Flags) when is_list(Flags), length(Flags) >= 0 ->
    try [iolist_to_binary(F) || F <- Flags] of
        Bins -> {ok, Bins}
    catch
        error:badarg -> error
    end;
flags(_) ->
    error.

raw_kernels(Kernels) when is_list(Kernels), length(Kernels) > 0 ->
    Checked = [raw_kernel(K) || K <- Kernels],
    case [E || {error, _} = E <- Checked] of
        [E | _] ->
            E;
        [] ->
            Decls = [D || {ok, D} <- Checked],
            Names = [N || {N, _} <- Decls],
            case Names -- lists:usort(Names) of
                [] -> {ok, Decls};
                [Dup | _] -> bad("kernel ~p is declared twice", [Dup])
            end
    end;
raw_kernels(Kernels) ->
    bad("kernels: a non-empty list of {Name, Params}, got ~0P", [Kernels, 8]).

raw_kernel({Name, Params}) ->
    case identifier(Name, "a kernel's name") of
        {ok, _} when is_list(Params), length(Params) =< 255 ->
            case [P || P <- Params, not raw_param(P)] of
                [] -> {ok, {Name, Params}};
                [P | _] -> bad("~p: ~0P is not {in | out | inout | scalar, Type} (Type one of "
                               "~w)", [Name, P, 8, erlcuda_vector:types()])
            end;
        {ok, _} ->
            bad("~p: its params are a list of at most 255", [Name]);
        {error, _} = Error ->
            Error
    end;
raw_kernel(Other) ->
    bad("~0P is not {Name, Params}", [Other, 8]).

raw_param({Access, Type}) ->
    lists:member(Access, [in, out, inout, scalar]) andalso erlcuda_vector:is_type(Type);
raw_param(_) ->
    false.

%% Inputs as {Var, Type, vector | scalar}, outputs as {Var, Type}.
variables(Name, Inputs, Outputs) when is_list(Inputs), is_list(Outputs), Outputs =/= [],
                                      length(Inputs) =< 255, length(Outputs) =< 255 ->
    Ins = [input(I) || I <- Inputs],
    Outs = [output(O) || O <- Outputs],
    case [E || {error, _} = E <- Ins ++ Outs] of
        [E | _] ->
            E;
        [] ->
            In = [I || {ok, I} <- Ins],
            Out = [O || {ok, O} <- Outs],
            Vars = [V || {V, _, _} <- In] ++ [V || {V, _} <- Out],
            Reserved = [i, n, Name],
            case {Vars -- lists:usort(Vars), [V || V <- Vars, lists:member(V, Reserved)],
                  [V || {V, _, vector} <- In]} of
                {[Dup | _], _, _} -> bad("~p is named twice", [Dup]);
                {[], [R | _], _} -> bad("the name ~p is taken (i is the element's index, n "
                                        "the count, and ~p the kernel)", [R, Name]);
                {[], [], []} -> bad("an elementwise kernel needs a vector input", []);
                _ -> {ok, {In, Out}}
            end
    end;
variables(_, Inputs, Outputs) ->
    bad("inputs and outputs: lists (outputs not empty, at most 255 each), got ~0P and ~0P",
        [Inputs, 8, Outputs, 8]).

input({Var, {scalar, Type}}) -> var(Var, Type, scalar);
input({Var, Type}) -> var(Var, Type, vector);
input(Other) -> bad("~0P is not {Var, Type} or {Var, {scalar, Type}}", [Other, 8]).

output({Var, Type}) ->
    case var(Var, Type, vector) of
        {ok, {V, T, _}} -> {ok, {V, T}};
        Error -> Error
    end;
output(Other) ->
    bad("~0P is not {Var, Type}", [Other, 8]).

var(Var, Type, Kind) ->
    case identifier(Var, "a variable") of
        {ok, _} ->
            case erlcuda_vector:is_type(Type) of
                true -> {ok, {Var, Type, Kind}};
                false -> bad("~p: ~0P is not one of ~w", [Var, Type, 8, erlcuda_vector:types()])
            end;
        Error ->
            Error
    end.

bad(Fmt, Args) ->
    {error, {bad_args, iolist_to_binary(io_lib:format(Fmt, Args))}}.
